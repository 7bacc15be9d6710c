"""hora across hosts: hierarchical vs flat allreduce vs raw gloo, and a training step, on a test
cluster of 2 namespaced hosts x 2 ranks whose links are shaped like a 1 Gbit/s network.

The cluster is tests/cluster's (root and `ip` needed): each host a network, UTS and mount
namespace with its own veth, hostname and /dev/shm, Spark standalone on them, and this process
the driver. Every veth is shaped to `--shape` (default 1gbit,0.2ms; a kernel without netem gets
the rate alone, as the output says). One 4-rank hora job on that Spark runs every side in the
same rounds, in an order that turns every round, so that a drift of the machine hits them all:

- allreduce (Sum, in place, float32) of each size: raw `torch.distributed.all_reduce` on gloo
  over the 4 ranks; `hvd.allreduce_` on hora's hierarchical path (shared memory within each
  host, each local rank's share across hosts in parallel: the default on this placement); and
  `hvd.allreduce_` on hora's flat path (`HOROVOD_HIERARCHICAL_ALLREDUCE=0`: gloo over the 4 ranks,
  as raw). Each side's world is started once per round (`hvd.init()` after the variable is set).
- a training step of the same model (an MLP whose gradients are about `--model-mb` MB) with
  `hvd.DistributedOptimizer` (hierarchical, and flat) and with torch's `DistributedDataParallel`
  (gloo, default buckets, overlapping the exchange with backward as DistributedOptimizer does).

What the network allows: every host must receive what the other host's ranks contribute, N
bytes per host for an allreduce of N bytes; gloo's ring over 4 ranks (2 of them per host) sends
1.5 N across each host's link, the hierarchical path N. On links of equal rate the bound of
hierarchical over flat is therefore 1.5x. Times are seconds per call (medians over rounds);
GB/s is algorithm bandwidth (tensor bytes / seconds).

    sudo .venv/bin/python bench/multihost.py [--sizes-mb 16 64] [--rounds 5] [--shape 1gbit,0.2ms]
        [--steps 4] [--model-mb 64] [--no-train]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.cluster

import hora
from tests.cluster._cluster import Cluster
from tests.cluster._hosts import Shape, ShapingUnsupported

HOSTS, PER_HOST = 2, 2
VAR = "HOROVOD_HIERARCHICAL_ALLREDUCE"
HIER, FLAT, RAW = "hora hierarchical", "hora flat", "raw gloo"
DO_HIER, DO_FLAT, DDP = "DistributedOptimizer hier", "DistributedOptimizer flat", "DDP"


def _calls_for(nbytes: int) -> int:
    """Calls per side and round: about 64 MB moved, at least 2."""
    return max(2, (64 << 20) // max(nbytes, 1))


def _model(mb: float) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    width = 1024
    layers = max(1, round(mb * (1 << 20) / 4 / (width * width + width)))
    stack: list[nn.Module] = []
    for _ in range(layers):
        stack += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*stack, nn.Linear(width, 10))


def _steps(model: Any, opt: Any, batch: tuple[Any, Any], steps: int) -> float:
    """Seconds per training step, over `steps` steps after one untimed."""
    import torch
    import torch.distributed as dist

    x, y = batch
    for i in range(steps + 1):
        if i == 1:
            dist.barrier()
            start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    dist.barrier()
    return (time.perf_counter() - start) / steps


def worker(
    sizes_mb: list[float], rounds: int, steps: int, model_mb: float, batch: int
) -> dict[str, Any]:
    """Every side, round after round; rank 0's times and where each rank ran."""
    import socket

    import torch
    import torch.distributed as dist

    import hora.torch as hvd
    from hora.collectives._control import state as _state

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(rank)
    data = (torch.randn(batch, 1024, generator=g), torch.randint(0, 10, (batch,), generator=g))
    tensors = {mb: torch.ones(int(mb * (1 << 20)) // 4) for mb in sizes_mb}
    times: dict[str, list[float]] = {}
    paths: dict[str, str] = {}

    def allreduces(side: str, call: Any) -> None:
        for mb, t in tensors.items():
            calls = _calls_for(t.nbytes)
            call(t)  # warm-up: connections, buffers
            dist.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                call(t)
            times.setdefault(f"{side} {mb:g}", []).append((time.perf_counter() - start) / calls)
            t.fill_(1.0)

    def hora_side(hierarchical: bool) -> None:
        os.environ[VAR] = "1" if hierarchical else "0"
        hvd.init()
        path = _state.get().groups[0].hierarchy
        on = path is not None and path.allreduce_on
        paths[HIER if hierarchical else FLAT] = "hierarchical" if on else "flat"
        allreduces(HIER if hierarchical else FLAT, lambda t: hvd.allreduce_(t, op=hvd.Sum))
        if steps:
            model = _model(model_mb)
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            opt = hvd.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=0.01),
                named_parameters=model.named_parameters(),
            )
            side = DO_HIER if hierarchical else DO_FLAT
            times.setdefault(side, []).append(_steps(model, opt, data, steps))
        hvd.shutdown()

    def raw_side() -> None:
        allreduces(RAW, dist.all_reduce)
        if steps:
            ddp = torch.nn.parallel.DistributedDataParallel(_model(model_mb))
            opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
            times.setdefault(DDP, []).append(_steps(ddp, opt, data, steps))

    sides = [lambda: hora_side(True), lambda: hora_side(False), raw_side]
    for r in range(rounds):
        for k in range(len(sides)):
            sides[(k + r) % len(sides)]()
    dist.destroy_process_group()
    return {"times": times, "paths": paths, "host": socket.gethostname()}


def _shape(cluster: Cluster, text: str) -> str:
    """Shape every link; without netem (the delay), the rate and loss alone. What was
    applied."""
    shape = Shape.parse(text)
    try:
        cluster.shape(shape)
        return text
    except ShapingUnsupported as exc:
        if shape.rate is None and not shape.loss_pct:
            raise
        cluster.shape(Shape(shape.rate, loss_pct=shape.loss_pct))
        loss = f"{shape.loss_pct:g}%" if shape.loss_pct else None
        applied = ",".join(part for part in (shape.rate, loss) if part)
        return f"{applied} ({exc}: no delay)"


def _start_spark(cluster: Cluster) -> Any:
    from tests.cluster.conftest import spark_session_on

    return spark_session_on(cluster, cores=PER_HOST, memory="1g")


def report(results: list[dict[str, Any]], sizes_mb: list[float], steps: int) -> None:
    times = results[0]["times"]
    med = {k: statistics.median(v) for k, v in times.items()}
    hosts = [res["host"] for res in results]
    print(f"ranks: {', '.join(f'{r}->{h}' for r, h in enumerate(hosts))}")
    print(f"paths: {results[0]['paths']}")
    head = f"{'size':>6} {'side':>18} {'s/call':>8} {'GB/s':>6} {'vs raw gloo':>11}"
    print(f"{head} {'per round':>20}")
    for mb in sizes_mb:
        raw = times[f"{RAW} {mb:g}"]
        for side in (HIER, FLAT, RAW):
            mine = times[f"{side} {mb:g}"]
            ratios = " ".join(f"{r / m:.2f}" for r, m in zip(raw, mine, strict=True))
            seconds = med[f"{side} {mb:g}"]
            print(
                f"{mb:>4g}MB {side:>18} {seconds:>8.3f} {mb / 1024 / seconds:>6.3f} "
                f"{med[f'{RAW} {mb:g}'] / seconds:>10.2f}x {ratios:>20}"
            )
    if steps:
        print(f"{'training step':>25} {'s/step':>8} {'vs DDP':>8} {'per round':>20}")
        for side in (DO_HIER, DO_FLAT, DDP):
            ratios = " ".join(f"{d / m:.2f}" for d, m in zip(times[DDP], times[side], strict=True))
            print(f"{side:>25} {med[side]:>8.3f} {med[DDP] / med[side]:>7.2f}x {ratios:>20}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[16, 64])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shape", default="1gbit,0.2ms", help="every link: RATE[,DELAY]")
    parser.add_argument("--steps", type=int, default=4, help="timed training steps per round")
    parser.add_argument("--model-mb", type=float, default=64, help="the model's gradient MB")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--no-train", action="store_true")
    args = parser.parse_args()
    steps = 0 if args.no_train else args.steps
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}, load average {os.getloadavg()}")
    with Cluster(HOSTS, PER_HOST, spark=True) as cluster:
        session = _start_spark(cluster)
        try:
            shaped = _shape(cluster, args.shape)
            print(f"{HOSTS} hosts x {PER_HOST} ranks, every link shaped: {shaped}")
            work = (args.sizes_mb, args.rounds, steps, args.model_mb, args.batch_size)
            results = hora.run(worker, work, np=HOSTS * PER_HOST, backend="spark", timeout=3600)
        finally:
            from tests.spark.conftest import stop_spark

            stop_spark(session)
    report(results, args.sizes_mb, steps)
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}, load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
