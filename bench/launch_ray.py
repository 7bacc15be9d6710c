"""Ray launch overhead: a tiny 2-rank gloo job on one warm local Ray, hora against Ray Train.

Times, alternating in one run on the same Ray cluster, `hora.run(job, np=2, backend="ray")`
(two actors in a placement group, each starting a hora worker) and Ray Train's
`TorchTrainer(job, scaling_config=ScalingConfig(num_workers=2))` (Ray Train's controller and two
training workers, gloo set up by Ray Train); each is timed from the call to the result on the
driver, and prints medians and the ratio (goal: hora >= 3x faster).

    .venv/bin/python bench/launch_ray.py [--reps 5] [--only hora|ray-train]

Everything binds to 127.0.0.1 where Ray lets it; Ray's dashboard is off.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

EXPECTED = [3.0] * 4
HORA = 'hora.run(np=2, backend="ray")'
RAY_TRAIN = "Ray Train TorchTrainer(num_workers=2)"


def allreduce() -> list[float]:
    """One allreduce on the process group the launcher set up."""
    import torch
    import torch.distributed as dist

    t = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return t.tolist()


def hora_job() -> list[float]:
    """hora's ranks: init gloo from torchrun's environment, one allreduce."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    result = allreduce()
    dist.destroy_process_group()
    return result


def ray_train_job(config: dict) -> None:
    """Ray Train's workers: Ray Train has set up gloo. Rank 0 writes the result to a file the
    driver reads after `fit()` (Ray Train returns the metrics of checkpoints only)."""
    import json

    import torch.distributed as dist

    result = allreduce()
    if dist.get_rank() == 0:
        with open(config["out"], "w") as f:
            json.dump(result, f)


def run_hora() -> list[float]:
    import hora

    return hora.run(hora_job, np=2, backend="ray")[0]


def run_ray_train(storage: str) -> list[float]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    out = os.path.join(storage, f"result-{time.time_ns()}.json")
    trainer = TorchTrainer(
        ray_train_job,
        train_loop_config={"out": out},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(storage_path=storage, name=f"bench-{time.time_ns()}"),
    )
    trainer.fit()
    with open(out) as f:
        return json.load(f)


def ship_jobs_by_value() -> None:
    """Ray workers cannot import this file as a module: ship the jobs by value."""
    import cloudpickle
    from ray import cloudpickle as ray_cloudpickle

    for pickler in (cloudpickle, ray_cloudpickle):
        pickler.register_pickle_by_value(sys.modules[__name__])


def time_it(fn: Callable[[], list[float]]) -> float:
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    assert result == EXPECTED, result
    return elapsed


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", choices=("hora", "ray-train"), default=None)
    parser.add_argument("--num-cpus", type=int, default=4, help="the local Ray's logical CPUs")
    args = parser.parse_args(argv)

    import ray
    import torch  # noqa: F401  (both drivers have torch imported before the clock starts)

    started = time.perf_counter()
    ray.init(
        address="local",
        num_cpus=args.num_cpus,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
    )
    init_s = time.perf_counter() - started
    ship_jobs_by_value()
    storage = tempfile.mkdtemp(prefix="hora-bench-ray-")
    contenders: dict[str, Callable[[], list[float]]] = {}
    if args.only in (None, "hora"):
        contenders[HORA] = run_hora
    if args.only in (None, "ray-train"):
        contenders[RAY_TRAIN] = lambda: run_ray_train(storage)
    try:
        for fn in contenders.values():  # warm-up: Ray's worker pool, imports
            time_it(fn)
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(args.reps):
            for name, fn in contenders.items():
                times[name].append(time_it(fn))
    finally:
        ray.shutdown()

    medians = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"\nlocal Ray start (ray.init, {args.num_cpus} CPUs): {init_s:.1f} s (not counted below)")
    print(f"2-rank gloo allreduce on a warm local Ray, call to result, median of {args.reps} (s)")
    for name, median in medians.items():
        spread = f"{min(times[name]):.2f}-{max(times[name]):.2f}"
        print(f"  {name:40s} {median:6.2f} s  (range {spread})")
    if len(medians) == 2:
        ratio = medians[RAY_TRAIN] / medians[HORA]
        print(f"{RAY_TRAIN} / {HORA} = {ratio:.2f} (goal >= 3)")
    return medians


if __name__ == "__main__":
    main()
