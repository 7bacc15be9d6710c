"""hvd.allreduce against raw torch.distributed.all_reduce: throughput on 2 ranks, same run.

Both sides run in the same hora job, on the same gloo transport over 127.0.0.1, alternating
rounds so that load drifts hit both. hora's side pays for what Horovod's semantics add: the
out-of-place copy, the average, name matching with the coordinator and the engine thread. Both
the out-of-place `hvd.allreduce` (Average) and the in-place `hvd.allreduce_` (Sum, like raw) are
timed. Throughput is algorithm bandwidth: tensor bytes / seconds per call.

    .venv/bin/python bench/allreduce.py [--sizes-mb 1 16 64] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import hora


def _calls_for(nbytes: int) -> int:
    """Enough calls per timed round to last tens of milliseconds."""
    return max(3, min(50, (64 << 20) // max(nbytes, 1) * 3 // 4))


def worker(sizes_mb: list[float], rounds: int) -> dict[float, dict[str, list[float]]]:
    import torch
    import torch.distributed as dist

    import hora.torch as hvd

    hvd.init()
    out: dict[float, dict[str, list[float]]] = {}
    for mb in sizes_mb:
        n = int(mb * (1 << 20)) // 4
        t = torch.ones(n)
        calls = _calls_for(n * 4)
        sides = {
            "raw": lambda t=t: dist.all_reduce(t),
            "hvd.allreduce": lambda t=t: hvd.allreduce(t, name="bench"),
            "hvd.allreduce_": lambda t=t: hvd.allreduce_(t, op=hvd.Sum, name="bench_"),
        }
        for fn in sides.values():  # warm-up: buffers, connections, caches
            fn()
        times: dict[str, list[float]] = {k: [] for k in sides}
        for r in range(rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for key in order:
                dist.barrier()
                start = time.perf_counter()
                for _ in range(calls):
                    sides[key]()
                times[key].append((time.perf_counter() - start) / calls)
            t.fill_(1.0)  # keep values finite across repeated sums
        out[mb] = times
    hvd.shutdown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 16, 64])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    results = hora.run(worker, (args.sizes_mb, args.rounds), np=2)[0]
    print(
        f"{'size':>7} {'raw GB/s':>9} {'allreduce GB/s':>15} {'ratio':>6} "
        f"{'allreduce_ GB/s':>16} {'ratio':>6}"
    )
    for mb, times in results.items():
        gbs = {k: mb / 1024 / statistics.median(v) for k, v in times.items()}
        raw = gbs["raw"]
        print(
            f"{mb:>5g}MB {raw:>9.2f} {gbs['hvd.allreduce']:>15.2f} "
            f"{gbs['hvd.allreduce'] / raw:>5.2f}x {gbs['hvd.allreduce_']:>16.2f} "
            f"{gbs['hvd.allreduce_'] / raw:>5.2f}x"
        )


if __name__ == "__main__":
    main()
