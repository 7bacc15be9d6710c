"""What an elastic job's step costs when nothing fails: in place (the default) against today's
restart-only elastic run (`HORA_ELASTIC_IN_PLACE=0`) and a fixed-size run, on this machine.

Issue 32 asks that recovering in place leave the per-step cost of an elastic job without
failures as it was. The same `hvd.elastic.run` loop (an MLP of ~1M parameters,
DistributedOptimizer, a TorchState committed every 10 steps) runs np=2 in three ways, rounds
alternating:

- in place: `min_np=1, max_np=2` (already at max_np: no growth), the default; on Spark each
  rank is then a Spark job of its own instead of a barrier stage;
- restart: the same with `HORA_ELASTIC_IN_PLACE=0` (the barrier stage on Spark);
- fixed: `np=2`, not elastic.

Each rank times its steps after a warm-up; a round's figure is rank 0's median step. Printed:
the median over rounds of each way, and in place over each other way.

    .venv/bin/python bench/elastic_step_cost.py [--backend local|spark|both] [--rounds 3]

Wall-clock, on the shared 2-core machine: compare the rows of one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import hora

WARMUP = 20
STEPS = 150
COMMIT_EVERY = 10


def train(steps: int) -> float:
    """`steps` timed steps of the elastic loop after the warm-up: the median step, seconds."""
    import torch
    from torch import nn

    import hora.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU())
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.01), named_parameters=net.named_parameters()
    )
    state = hvd.elastic.TorchState(net, opt, step=0)
    x, y = torch.randn(64, 512), torch.randn(64, 512)
    times: list[float] = []

    @hvd.elastic.run
    def loop(state: Any) -> None:
        while state.step < WARMUP + steps:
            start = time.perf_counter()
            opt.zero_grad()
            nn.functional.mse_loss(net(x), y).backward()
            opt.step()
            state.step += 1
            if state.step % COMMIT_EVERY == 0:
                state.commit()
            if state.step > WARMUP:
                times.append(time.perf_counter() - start)

    loop(state)
    return statistics.median(times)


WAYS: dict[str, tuple[dict[str, int], str]] = {
    "in place": ({"min_np": 1, "max_np": 2}, "1"),
    "restart": ({"min_np": 1, "max_np": 2}, "0"),
    "fixed": ({}, "1"),
}


def one_round(backend: str, way: str) -> float:
    sizes, in_place = WAYS[way]
    os.environ["HORA_ELASTIC_IN_PLACE"] = in_place
    results = hora.run(train, (STEPS,), np=2, backend=backend, progress=False, **sizes)
    return float(results[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("local", "spark", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    backends = ["local", "spark"] if args.backend == "both" else [args.backend]
    if "spark" in backends:
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.master("local[2]")
        builder.config("spark.ui.showConsoleProgress", "false").getOrCreate()
    for backend in backends:
        got: dict[str, list[float]] = {way: [] for way in WAYS}
        for _ in range(args.rounds):
            for way in WAYS:
                got[way].append(one_round(backend, way))
        print(f"{backend}: median step of rank 0, ms (np=2, {STEPS} steps, {args.rounds} rounds)")
        median = {way: statistics.median(times) * 1e3 for way, times in got.items()}
        for way, times in got.items():
            runs = ", ".join(f"{t * 1e3:.2f}" for t in times)
            print(f"  {way:9s} {median[way]:6.2f}  (rounds {runs})")
        for other in ("restart", "fixed"):
            print(f"  in place / {other}: {median['in place'] / median[other]:.3f}")


if __name__ == "__main__":
    main()
