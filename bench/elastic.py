"""Elastic runs on 2 namespaced hosts x 2 slots (tests/cluster, as root): what a lost host costs.

Runs of the same paced training loop (a small MLP, 0.1 s per step, a commit every 2
steps), each losing host 2 (every process on it SIGKILLed) at the same step:

- hora elastic on Spark (`np=4, min_np=2, max_np=4`), in place (host 1's ranks keep their
  processes; new tasks join them) and by today's restart (`HORA_ELASTIC_IN_PLACE=0`): seconds
  from the loss to the first step at 2 ranks; host 2 is brought back once the run is small, and
  seconds from its return (its executor registered again) to the first step at 4 ranks;
- hora fixed-size on Spark (`np=4, max_restarts=1`, today's restart): it waits for a
  replacement, so host 2 is brought back at once; seconds from the loss to the first step at 4
  ranks (the replacement's time included, and printed apart);
- hora elastic on Ray (`np=4, min_np=2, max_np=4`, `--reps` runs of each, alternating): in
  place (the survivors re-form; new actors in the lost bundles once the node is back), against
  today's restarts (`HORA_ELASTIC_IN_PLACE=0`): seconds from the loss to the first step at 2
  ranks, and from the node's return (alive in the driver's view) to the first step at 4;
- Ray Train's elastic `ScalingConfig(num_workers=(2, 4))` on the same hosts' Ray nodes (Ray
  2.60's Train v2, its resize check every 5 s as hora's settle time): seconds from the loss to
  the first step at the smaller size, and from the node's return to the first step at 4.

    sudo .venv/bin/python bench/elastic.py [--only hora|fixed|ray|ray-train] [--reps 3]
    .venv/bin/python bench/elastic.py --commit-cost   # what one commit costs, no cluster

Times are wall-clock, from the moment the bench killed the host to a step's log line written by
a rank, on the shared 2-core machine: compare the rows of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

STEPS = 400
LOSE_AT = 10  # the step (of the first attempt) at which host 2 is lost
STEP_SECONDS = 0.1
HOST_MARK, SMALL_MARK = "kill-host", "small"


def _log(folder: str, entry: dict[str, Any]) -> None:
    with open(os.path.join(folder, f"steps-{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(entry) + "\n")


def _lose_host_here(folder: str) -> None:
    Path(folder, HOST_MARK).write_text(socket.gethostname())
    time.sleep(3600)


def hora_job(
    folder: str, full: int, small_steps: int | None = None, grown_steps: int | None = None
) -> None:
    """The paced loop under hvd.elastic: a commit every 2 steps (kept on each host). A world
    re-formed in place calls `loop` again in the same process (with its own rank and size);
    with `small_steps`, the run ends that many steps past the loss once it is small; with
    `grown_steps`, that many steps after it is back at `full` after the loss."""
    import torch

    import hora.torch as hvd

    hvd.init()
    attempt = int(os.environ["HORA_RESTART_COUNT"])
    calls = [0]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )
    state = hvd.elastic.TorchState(model, opt, step=0)

    @hvd.elastic.run
    def loop(state: Any) -> None:
        # the run's first world: not a later attempt, a world re-formed in place, or a rank
        # started to grow one (it starts in a later generation)
        generation = int(os.environ.get("HORA_WORLD_GENERATION") or 0)
        rank, world = hvd.rank(), hvd.size()
        first = attempt == 0 and calls[0] == 0 and generation == 0
        calls[0] += 1
        began = state.step
        while state.step < STEPS:
            if small_steps is not None and world < full and state.step >= LOSE_AT + small_steps:
                return  # the figure is in (every rank has the same step)
            grown = not first and world == full
            if grown and grown_steps is not None and state.step >= began + grown_steps:
                return  # back at full size for a while: the figure is in
            x = torch.randn(16, 32)
            state.optimizer.zero_grad()
            state.model(x).pow(2).mean().backward()
            state.optimizer.step()
            _log(folder, {"attempt": attempt, "world": world, "rank": rank, "t": time.time()})
            if first and rank == world - 1 and state.step == LOSE_AT:
                _lose_host_here(folder)
            if world < full and rank == 0:
                Path(folder, SMALL_MARK).touch()
            time.sleep(STEP_SECONDS)
            state.step += 1
            if state.step % 2 == 0:
                state.commit()

    loop(state)


def ray_train_loop(config: dict[str, Any]) -> None:
    """The same loop under Ray Train (no hora): Ray Train set up gloo and the world."""
    import ray.train
    import torch
    import torch.distributed as dist

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    folder = config["folder"]
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    for step in range(STEPS):
        x = torch.randn(16, 32)
        model.zero_grad()
        model(x).pow(2).mean().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        _log(folder, {"attempt": world, "world": world, "rank": rank, "t": time.time()})
        first = not Path(folder, HOST_MARK).exists()
        if first and world == config["full"] and rank == world - 1 and step == LOSE_AT:
            _lose_host_here(folder)
        if world < config["full"] and rank == 0:
            Path(folder, SMALL_MARK).touch()  # the bench brings the host back
        time.sleep(STEP_SECONDS)
        if not first and world == config["full"] and step >= 20:
            return  # back at full size for a while: the figure is in


def _steps(folder: str) -> list[dict[str, Any]]:
    entries = []
    for path in Path(folder).glob("steps-*.jsonl"):
        entries += [json.loads(line) for line in path.read_text().splitlines()]
    return entries


def _first_step(folder: str, world: int, after: float) -> float:
    times = [e["t"] for e in _steps(folder) if e["world"] == world and e["t"] > after]
    return min(times) if times else float("nan")


class Fault(threading.Thread):
    """Kill the host a rank marks; then, once `back_when` exists (or at once), bring it back."""

    def __init__(self, cluster: Any, folder: str, back_when: str | None, whole: Any) -> None:
        super().__init__(daemon=True)
        self.cluster, self.folder, self.back_when, self.whole = cluster, folder, back_when, whole
        self.lost_at = self.back_at = self.replaced_in = float("nan")
        self.done = threading.Event()

    def run(self) -> None:
        mark = Path(self.folder, HOST_MARK)
        while not mark.exists() and not self.done.wait(0.05):
            pass
        if self.done.is_set():
            return
        self.cluster.kill_host(mark.read_text())
        self.lost_at = time.time()
        if self.back_when is not None:
            while not Path(self.folder, self.back_when).exists() and not self.done.wait(0.05):
                pass
        began = time.time()
        self.whole(self.cluster)
        self.back_at = time.time()
        self.replaced_in = self.back_at - began


def run_hora(cluster: Any, whole: Any, elastic: bool, in_place: bool = True) -> dict[str, float]:
    import hora

    folder = tempfile.mkdtemp(prefix="hora-bench-elastic-")
    fault = Fault(cluster, folder, SMALL_MARK if elastic else None, whole)
    fault.start()
    sizes = {"min_np": 2, "max_np": 4} if elastic else {"max_restarts": 1}
    env = {"HORA_ELASTIC_IN_PLACE": "1" if in_place else "0"}
    try:
        hora.run(hora_job, (folder, 4), np=4, backend="spark", timeout=600, env=env, **sizes)
    finally:
        fault.done.set()
        fault.join()
    if elastic:
        return {
            "loss -> first step at 2": _first_step(folder, 2, fault.lost_at) - fault.lost_at,
            "return -> first step at 4": _first_step(folder, 4, fault.back_at) - fault.back_at,
        }
    return {
        "loss -> first step at 4": _first_step(folder, 4, fault.lost_at) - fault.lost_at,
        "  of which the replacement": fault.replaced_in,
    }


def run_hora_ray(cluster: Any, whole: Any, in_place: bool) -> tuple[float, float]:
    """hora elastic on Ray (`np=4, min_np=2, max_np=4`), host 2 brought back once the run is
    small: seconds from the loss to the first step at 2 ranks, and from the node's return (alive
    in the driver's view) to the first step at 4, in place or (in_place False:
    `HORA_ELASTIC_IN_PLACE=0`) by restarts after the settle time."""
    import hora

    folder = tempfile.mkdtemp(prefix="hora-bench-elastic-ray-")
    fault = Fault(cluster, folder, SMALL_MARK, whole)
    fault.start()
    env = {"HORA_ELASTIC_IN_PLACE": "1" if in_place else "0"}
    try:
        hora.run(
            hora_job,
            (folder, 4, None, 20),
            np=4,
            min_np=2,
            max_np=4,
            backend="ray",
            timeout=600,
            env=env,
        )
    finally:
        fault.done.set()
        fault.join()
    lost = _first_step(folder, 2, fault.lost_at) - fault.lost_at
    return lost, _first_step(folder, 4, fault.back_at) - fault.back_at


def compare_on_ray(cluster: Any, whole: Any, reps: int) -> dict[str, dict[str, float]]:
    """In place against today's restart on Ray, alternating, `reps` runs of each."""
    import statistics

    seconds: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for _ in range(reps):
        for in_place in (True, False):
            seconds[in_place].append(run_hora_ray(cluster, whole, in_place))
    rows = {}
    for in_place, name in ((True, "hora elastic in place (Ray)"), (False, "hora restart (Ray)")):
        runs = seconds[in_place]
        rows[name] = {}
        for i, (lost, back) in enumerate(runs):
            rows[name][f"loss -> first step at 2 (run {i + 1})"] = lost
            rows[name][f"return -> first step at 4 (run {i + 1})"] = back
        rows[name]["  median loss -> 2"] = statistics.median(r[0] for r in runs)
        rows[name]["  median return -> 4"] = statistics.median(r[1] for r in runs)
    return rows


def run_ray_train(cluster: Any, whole: Any) -> dict[str, float]:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    folder = tempfile.mkdtemp(prefix="hora-bench-raytrain-")
    os.chmod(folder, 0o777)
    fault = Fault(cluster, folder, SMALL_MARK, whole)
    fault.start()
    try:
        TorchTrainer(
            ray_train_loop,
            train_loop_config={"folder": folder, "full": 4},
            scaling_config=ScalingConfig(
                num_workers=(2, 4),
                resources_per_worker={"CPU": 1},
                # it looks for room to grow every 60 s by default: hora's settle time instead
                elastic_resize_monitor_interval_s=5.0,
            ),
            run_config=RunConfig(storage_path=folder, failure_config=FailureConfig(max_failures=3)),
        ).fit()
    finally:
        fault.done.set()
        fault.join()
    smaller = [e for e in _steps(folder) if e["t"] > fault.lost_at and e["world"] < 4]
    first = min((e["t"] for e in smaller), default=float("nan"))
    world = smaller[0]["world"] if smaller else 0
    return {
        f"loss -> first step at {world}": first - fault.lost_at,
        "return -> first step at 4": _first_step(folder, 4, fault.back_at) - fault.back_at,
    }


def ray_whole(cluster: Any) -> None:
    """Host 2's services again, and its Ray node alive in the driver's view. (Its CPUs need not
    be free: a running placement group takes them again for the bundles it lost.)"""
    from tests.cluster.conftest import wait_for_ray_nodes

    cluster.make_whole()
    wait_for_ray_nodes(2)


def commit_cost(megabytes: int = 10, reps: int = 20) -> None:
    """One process (a world of one) commits a TorchState of a `megabytes` model (SGD with
    momentum: as much again of optimizer state): in memory only, then also to the host's
    commit store in /dev/shm, as a rank of a hora run does (its local rank 0)."""
    import statistics

    import torch

    import hora.torch as hvd

    os.environ["HORA_RUN_ID"] = f"bench-{os.getpid()}"
    hvd.init()
    width = int((megabytes * 2**20 / 4) ** 0.5)
    model = torch.nn.Linear(width, width, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, width)).sum().backward()
    opt.step()
    state = hvd.elastic.TorchState(model, opt, step=0)
    timings: dict[str, list[float]] = {"in memory": [], "in memory + host store": []}
    for _ in range(reps):
        began = time.perf_counter()
        state.save()
        timings["in memory"].append(time.perf_counter() - began)
        began = time.perf_counter()
        state.commit()
        timings["in memory + host store"].append(time.perf_counter() - began)
    state._commits.finish()
    size = sum(p.numel() * 4 for p in model.parameters()) / 2**20
    print(f"commit of a {size:.0f} MB model + {size:.0f} MB momentum (median of {reps}):")
    for what, values in timings.items():
        print(f"  {what}: {statistics.median(values) * 1000:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("hora", "fixed", "ray", "ray-train"))
    parser.add_argument("--reps", type=int, default=3, help="runs of each side with --only ray")
    parser.add_argument("--commit-cost", action="store_true", help="one commit's cost, only")
    args = parser.parse_args()
    if args.commit_cost:
        commit_cost()
        return
    import ray

    from tests.cluster._cluster import Cluster
    from tests.cluster.conftest import make_whole, wait_for_ray_cpus, wait_for_spark_executors
    from tests.spark.conftest import start_spark, stop_spark

    with Cluster(2, 2, spark=True, ray=True) as cluster:
        session = start_spark(
            cluster.spark_master,
            **{
                "spark.driver.host": cluster.driver_address,
                "spark.driver.bindAddress": cluster.driver_address,
                "spark.executor.memory": "512m",
                "spark.executor.cores": "2",
            },
        )
        ray.init(
            address=cluster.ray_address,
            _node_ip_address=cluster.driver_address,
            log_to_driver=False,
        )
        try:
            wait_for_spark_executors(session.sparkContext, 2)
            wait_for_ray_cpus(4)
            rows: dict[str, dict[str, float]] = {}
            if args.only in (None, "hora"):
                for in_place in (True, False):
                    how = "in place" if in_place else "restart"
                    rows[f"hora elastic {how} (Spark)"] = run_hora(
                        cluster, make_whole, elastic=True, in_place=in_place
                    )
                    make_whole(cluster)
            if args.only in (None, "fixed"):
                rows["hora fixed-size restart (Spark)"] = run_hora(cluster, make_whole, False)
                make_whole(cluster)
            if args.only in (None, "ray"):
                rows.update(compare_on_ray(cluster, ray_whole, args.reps))
            if args.only in (None, "ray-train"):
                try:
                    rows["Ray Train elastic (Ray)"] = run_ray_train(cluster, ray_whole)
                except Exception as exc:
                    rows["Ray Train elastic (Ray)"] = {f"failed: {exc}"[:200]: float("nan")}
            for name, figures in rows.items():
                print(name)
                for what, seconds in figures.items():
                    print(f"  {what}: {seconds:.1f} s")
        finally:
            ray.shutdown()
            stop_spark(session)


if __name__ == "__main__":
    main()
