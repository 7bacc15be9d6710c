"""Real ranks on this one host, np 2 to 64 (issue 45): what a world this large costs here.

Each run is one local hora job (`tests/scale/_every_op.every_op`): every op kind checked on
every rank, then `--allreduces` allreduces of 1,024 floats timed from a barrier. Printed per
np: run() to results, the time per allreduce (the median of the ranks' means), the machine's
memory in use at the job's peak beyond what it was before, and the ranks' peak RSS. From np 16
the negotiation's tree (the default, HORA_NEGOTIATION_FANOUT 8) alternates with the star it
replaced (a fanout of np - 1: every rank reports to rank 0), `--reps` runs of each.

On this 2-core machine np 32 and 64 are many ranks to a core: the times are the scheduler's as
much as hora's. Compare the rows of one run.

    .venv/bin/python bench/one_host.py [--sizes 2 8 16 32 64] [--reps 1] [--allreduces 50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from typing import Any

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import hora
from tests.scale import _every_op

TREE_FROM = 16  # below, the tree of fanout 8 is (nearly) the star


class MemoryPeak(threading.Thread):
    """The machine's memory in use, sampled every 0.2 s: its peak above the start's."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.base = self.peak = psutil.virtual_memory().used
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            self.peak = max(self.peak, psutil.virtual_memory().used)

    def __enter__(self) -> MemoryPeak:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join()


def job(np: int, allreduces: int, fanout: int | None) -> dict[str, Any]:
    """One job of `np` ranks; its figures."""
    env = {"HORA_NEGOTIATION_FANOUT": str(fanout)} if fanout else {}
    with MemoryPeak() as memory:
        began = time.perf_counter()
        results = hora.run(_every_op.every_op, (allreduces,), np=np, env=env, timeout=900)
        seconds = time.perf_counter() - began
    failed = _every_op.failures(results)
    if failed:
        raise RuntimeError(f"np {np}: {len(failed)} failures, first {next(iter(failed.items()))}")
    return {
        "run_s": seconds,
        "allreduce_ms": statistics.median(r["allreduce_s"] for r in results) * 1000,
        "memory_gib": (memory.peak - memory.base) / 2**30,
        "rss_mib": max(r["rss_mib"] for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 8, 16, 32, 64])
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--allreduces", type=int, default=50)
    args = parser.parse_args()
    print(f"1-minute load average at the start: {os.getloadavg()[0]:.1f}; {os.cpu_count()} cores")
    for np in args.sizes:
        sides = {"tree": None} | ({"star": np - 1} if np >= TREE_FROM else {})
        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
        for _ in range(args.reps):
            for side, fanout in sides.items():
                runs[side].append(job(np, args.allreduces, fanout))
        for side, got in runs.items():
            m = {k: statistics.median(r[k] for r in got) for k in got[0]}
            print(
                f"np={np:3d} {side}: run() to results {m['run_s']:.1f} s, allreduce of 4 KB "
                f"{m['allreduce_ms']:.2f} ms, memory at the peak +{m['memory_gib']:.1f} GiB "
                f"(a rank's peak RSS {m['rss_mib']:.0f} MiB), load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
        if "star" in runs:
            tree = statistics.median(r["allreduce_ms"] for r in runs["tree"])
            star = statistics.median(r["allreduce_ms"] for r in runs["star"])
            print(f"np={np:3d} allreduce star / tree {star / tree:.2f}x", flush=True)


if __name__ == "__main__":
    main()
