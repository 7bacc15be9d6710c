"""Elastic runs on namespaced hosts (tests/cluster, as root; 2 hosts x 2 slots unless `--hosts`,
`--slots` say): what a lost host costs.

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
    sudo .venv/bin/python bench/elastic.py --hosts 8 --slots 4 --only hora   # 32 ranks
    .venv/bin/python bench/elastic.py --commit-cost   # what one commit costs, no cluster

With other sizes the same: `np` = hosts x slots, `min_np` one host fewer, the last host lost.
Times are wall-clock, from the moment the bench killed the host to a step's log line written by
a rank, on the shared 2-core machine: compare the rows of one run. The return is timed from the
lost host's services started again (Spark worker registered with the master, Ray node started)
and from the moment the driver sees them (executor registered, node alive); the driver's own
breakdown of a growth in place follows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
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
    """Kill the host a rank marks; then, once `back_when` exists (or at once), bring it back:
    its services started again (`started_at`), then seen by the driver (`whole`, `back_at`)."""

    def __init__(self, cluster: Any, folder: str, back_when: str | None, whole: Any) -> None:
        super().__init__(daemon=True)
        self.cluster, self.folder, self.back_when, self.whole = cluster, folder, back_when, whole
        self.lost_at = self.started_at = self.back_at = self.replaced_in = float("nan")
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
        self.cluster.make_whole()  # the host's Spark worker registered, its Ray node started
        self.started_at = time.time()
        self.whole(self.cluster)
        self.back_at = time.time()
        self.replaced_in = self.back_at - began


class Said:
    """The driver's lines (hora writes them to stderr), kept as they pass through on their way
    to stderr: `with said: hora.run(...)`."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._outer = sys.stderr
        self._redirect = contextlib.redirect_stderr(self)  # type: ignore[type-var]

    def write(self, text: str) -> int:
        self.lines.append(text)
        return self._outer.write(text)

    def flush(self) -> None:
        self._outer.flush()

    def __enter__(self) -> Said:
        self._redirect.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._redirect.__exit__(*exc)

    def growth(self) -> dict[str, float]:
        """The driver's breakdown of the last growth in place, if any."""
        found = re.findall(
            r"the new ranks' start \(process, imports, init\) ([0-9.]+) s, then the running "
            r"ranks' way to their next commit and the sync ([0-9.]+) s",
            "".join(self.lines),
        )
        if not found:
            return {}
        start, sync = found[-1]
        return {
            "  driver: the new ranks' start": float(start),
            "  driver: the running ranks' way to their commit and the sync": float(sync),
        }


def _sizes(cluster: Any) -> tuple[int, int]:
    """The run's full size (every slot) and its size without the lost host."""
    full = cluster.count * cluster.cores
    return full, full - cluster.cores


def _returned(folder: str, full: int, fault: Fault) -> dict[str, float]:
    """From the lost host's return to the first step at the full size: from its services
    started again, and from the driver seeing them."""
    first = _first_step(folder, full, fault.back_at)
    return {
        f"return (services started) -> first step at {full}": first - fault.started_at,
        f"return (seen by the driver) -> first step at {full}": first - fault.back_at,
    }


def run_hora(cluster: Any, whole: Any, elastic: bool, in_place: bool = True) -> dict[str, float]:
    import hora

    full, small = _sizes(cluster)
    folder = tempfile.mkdtemp(prefix="hora-bench-elastic-")
    fault = Fault(cluster, folder, SMALL_MARK if elastic else None, whole)
    fault.start()
    sizes = {"min_np": small, "max_np": full} if elastic else {"max_restarts": 1}
    env = {"HORA_ELASTIC_IN_PLACE": "1" if in_place else "0"}
    said = Said()
    try:
        with said:
            hora.run(
                hora_job,
                (folder, full, None, 20),  # ends 20 steps after it is back at full size
                np=full,
                backend="spark",
                timeout=600,
                env=env,
                **sizes,
            )
    finally:
        fault.done.set()
        fault.join()
    if elastic:
        lost = _first_step(folder, small, fault.lost_at) - fault.lost_at
        return (
            {f"loss -> first step at {small}": lost}
            | _returned(folder, full, fault)
            | (said.growth())
        )
    return {
        f"loss -> first step at {full}": _first_step(folder, full, fault.lost_at) - fault.lost_at,
        "  of which the replacement": fault.replaced_in,
    }


def run_hora_ray(cluster: Any, whole: Any, in_place: bool) -> tuple[float, float]:
    """hora elastic on Ray (every slot, one host fewer at least), the last host brought back
    once the run is small: seconds from the loss to the first step at the smaller size, and
    from the node's return (alive in the driver's view) to the first step at the full size, in
    place or (in_place False: `HORA_ELASTIC_IN_PLACE=0`) by restarts after the settle time."""
    import hora

    full, small = _sizes(cluster)
    folder = tempfile.mkdtemp(prefix="hora-bench-elastic-ray-")
    fault = Fault(cluster, folder, SMALL_MARK, whole)
    fault.start()
    env = {"HORA_ELASTIC_IN_PLACE": "1" if in_place else "0"}
    try:
        hora.run(
            hora_job,
            (folder, full, None, 20),
            np=full,
            min_np=small,
            max_np=full,
            backend="ray",
            timeout=600,
            env=env,
        )
    finally:
        fault.done.set()
        fault.join()
    lost = _first_step(folder, small, fault.lost_at) - fault.lost_at
    return lost, _first_step(folder, full, fault.back_at) - fault.back_at


def compare_on_ray(cluster: Any, whole: Any, reps: int) -> dict[str, dict[str, float]]:
    """In place against today's restart on Ray, alternating, `reps` runs of each."""
    import statistics

    seconds: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for _ in range(reps):
        for in_place in (True, False):
            seconds[in_place].append(run_hora_ray(cluster, whole, in_place))
    full, small = _sizes(cluster)
    rows = {}
    for in_place, name in ((True, "hora elastic in place (Ray)"), (False, "hora restart (Ray)")):
        runs = seconds[in_place]
        rows[name] = {}
        for i, (lost, back) in enumerate(runs):
            rows[name][f"loss -> first step at {small} (run {i + 1})"] = lost
            rows[name][f"return -> first step at {full} (run {i + 1})"] = back
        rows[name][f"  median loss -> {small}"] = statistics.median(r[0] for r in runs)
        rows[name][f"  median return -> {full}"] = statistics.median(r[1] for r in runs)
    return rows


def run_ray_train(cluster: Any, whole: Any) -> dict[str, float]:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    full, small = _sizes(cluster)
    folder = tempfile.mkdtemp(prefix="hora-bench-raytrain-")
    os.chmod(folder, 0o777)
    fault = Fault(cluster, folder, SMALL_MARK, whole)
    fault.start()
    try:
        TorchTrainer(
            ray_train_loop,
            train_loop_config={"folder": folder, "full": full},
            scaling_config=ScalingConfig(
                num_workers=(small, full),
                resources_per_worker={"CPU": 1},
                # it looks for room to grow every 60 s by default: hora's settle time instead
                elastic_resize_monitor_interval_s=5.0,
            ),
            run_config=RunConfig(storage_path=folder, failure_config=FailureConfig(max_failures=3)),
        ).fit()
    finally:
        fault.done.set()
        fault.join()
    smaller = [e for e in _steps(folder) if e["t"] > fault.lost_at and e["world"] < full]
    first = min((e["t"] for e in smaller), default=float("nan"))
    world = smaller[0]["world"] if smaller else 0
    back = _first_step(folder, full, fault.back_at) - fault.back_at
    return {f"loss -> first step at {world}": first - fault.lost_at, f"return -> {full}": back}


def ray_whole(cluster: Any) -> None:
    """The lost host's services again, and its Ray node alive in the driver's view. (Its CPUs
    need not be free: a running placement group takes them again for the bundles it lost.)"""
    from tests.cluster.conftest import wait_for_ray_nodes

    cluster.make_whole()
    wait_for_ray_nodes(cluster.count)


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


def measure(cluster: Any, only: str | None, reps: int) -> dict[str, dict[str, float]]:
    """The runs `only` names (all by default), each side's figures by its name."""
    from tests.cluster.conftest import make_whole

    rows: dict[str, dict[str, float]] = {}
    if only in (None, "hora"):
        for in_place in (True, False):
            how = "in place" if in_place else "restart"
            rows[f"hora elastic {how} (Spark)"] = run_hora(
                cluster, make_whole, elastic=True, in_place=in_place
            )
            make_whole(cluster)
    if only in (None, "fixed"):
        rows["hora fixed-size restart (Spark)"] = run_hora(cluster, make_whole, False)
        make_whole(cluster)
    if only in (None, "ray"):
        rows.update(compare_on_ray(cluster, ray_whole, reps))
    if only in (None, "ray-train"):
        try:
            rows["Ray Train elastic (Ray)"] = run_ray_train(cluster, ray_whole)
        except Exception as exc:
            rows["Ray Train elastic (Ray)"] = {f"failed: {exc}"[:200]: float("nan")}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("hora", "fixed", "ray", "ray-train"))
    parser.add_argument("--reps", type=int, default=3, help="runs of each side with --only ray")
    parser.add_argument("--hosts", type=int, default=2, help="namespaced hosts (default 2)")
    parser.add_argument("--slots", type=int, default=2, help="ranks per host (default 2)")
    parser.add_argument("--commit-cost", action="store_true", help="one commit's cost, only")
    args = parser.parse_args()
    if args.commit_cost:
        commit_cost()
        return
    from tests.cluster._cluster import Cluster
    from tests.cluster.conftest import connect_ray, spark_session_on
    from tests.spark.conftest import stop_spark

    # each engine only where a run needs it: 8 hosts of both beside 32 ranks would not fit
    spark = args.only in (None, "hora", "fixed")
    ray_too = args.only in (None, "ray", "ray-train")
    with Cluster(args.hosts, args.slots, spark=spark, ray=ray_too) as cluster:
        session = spark_session_on(cluster) if spark else None
        if ray_too:
            connect_ray(cluster)
        try:
            print(f"{args.hosts} hosts x {args.slots} slots; load {os.getloadavg()[0]:.1f}")
            for name, figures in measure(cluster, args.only, args.reps).items():
                print(name)
                for what, seconds in figures.items():
                    print(f"  {what}: {seconds:.1f} s")
        finally:
            if ray_too:
                import ray

                ray.shutdown()
            if session is not None:
                stop_spark(session)


if __name__ == "__main__":
    main()
