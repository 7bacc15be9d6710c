"""hvd.allreduce against raw torch.distributed.all_reduce: throughput on 2 ranks, same run.

Both sides run in the same hora job over 127.0.0.1, alternating rounds so that load drifts hit
both. Like is compared with like (all with Sum):

- in place: `hvd.allreduce_(x)` against `dist.all_reduce(x)`;
- out of place: `hvd.allreduce(x)` against `out = x.clone(); dist.all_reduce(out)`, the raw
  equivalent (a fresh output must be allocated and page-faulted on both sides).

Both ranks share this host, so hora's allreduce goes through shared memory while raw
torch.distributed goes through gloo's loopback TCP: the default run measures what a user on one
machine gets. Beside them, in the same rounds, the memory limit of this host for the same job
(`MemoryLimit`): both ranks at once doing only the memory traffic that a shared-memory allreduce
cannot avoid, with plain torch ops and no synchronisation; hora's in-place GB/s is printed as a
fraction of it. `--no-shm` (HORA_SHM=0) puts hora on gloo too, as between hosts; what remains
between the two of a pair is then hora's own cost: name matching with the coordinator, the engine
thread, the hand-off. Throughput is algorithm bandwidth: tensor bytes / seconds per call.
`--gc-freeze` moves the objects made so far out of the collector's sight in this bench's
processes (the library never touches interpreter settings).

    .venv/bin/python bench/allreduce.py [--sizes-mb 1 16 64] [--rounds 7] [--no-shm]
        [--fusion-reps 10]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import hora

LIMIT = "memory limit"


def _calls_for(nbytes: int) -> int:
    """Enough calls per timed round to last a few hundred milliseconds, so that one scheduling
    hiccup of a 2-core host does not decide a round."""
    return max(5, min(100, (192 << 20) // max(nbytes, 1)))


def _raw_out_of_place(t: object) -> object:
    import torch.distributed as dist

    out = t.clone()  # type: ignore[attr-defined]
    dist.all_reduce(out)
    return out


class MemoryLimit:
    """The memory traffic a shared-memory allreduce of `x` cannot avoid, without its barriers.

    Rank r reduces share r (1/size of the tensor). It must read its input (the others' shares
    to hand them over, share r to reduce it), read share r of every other rank's input, write
    its share of the sum, and copy the whole result out. Handing a share over is a copy into a
    segment every rank maps: no process can read another's private tensor. For 2 ranks, with
    N the tensor's bytes, that is per rank: N/2 read and N/2 written (handing over), N read and
    N/2 written (reducing), N read and N written (copying out), here as plain torch ops on
    whole shares. Nothing waits for the peer, so the values are garbage; the traffic is not.
    """

    def __init__(self, x: Any, rank: int, size: int) -> None:
        import torch
        import torch.distributed as dist

        n = x.numel()
        # not hora-*: a test looks for segments left behind by that name
        name = [f"/dev/shm/allreduce-bench-limit-{os.getpid()}-{n}"]
        dist.broadcast_object_list(name, src=0)
        whole = None
        for turn in (0, 1):  # rank 0 makes the file, then the others map it
            if (rank == 0) == (turn == 0):  # size slots of the tensor's size, then the result
                whole = torch.from_file(name[0], shared=True, size=(size + 1) * n, dtype=x.dtype)
            dist.barrier()
        if rank == 0:
            os.unlink(name[0])
        self.x, self.rank = x, rank
        self.out = torch.empty_like(x)  # not x: its values stay finite
        self.slots = list(whole[: size * n].view(size, n))
        self.result = whole[size * n :]
        bounds = [n * k // size for k in range(size + 1)]
        self.shares = list(itertools.pairwise(bounds))

    def __call__(self) -> None:
        import torch

        x, mine = self.x, self.shares[self.rank]
        for k, (lo, hi) in enumerate(self.shares):
            if k != self.rank:
                self.slots[self.rank][lo:hi].copy_(x[lo:hi])
        lo, hi = mine
        peers = [s[lo:hi] for k, s in enumerate(self.slots) if k != self.rank]
        torch.add(x[lo:hi], peers[0], out=self.result[lo:hi])
        for other in peers[1:]:
            self.result[lo:hi].add_(other)
        self.out.copy_(self.result)


def _fusion(
    rounds: int, reps: int = 10, count: int = 200, nbytes: int = 4096
) -> dict[str, list[float]]:
    """`count` small allreduces: hvd async + synchronize vs raw separate calls vs raw fused."""
    import torch
    import torch.distributed as dist

    import hora.torch as hvd

    ts = [torch.ones(nbytes // 4) for _ in range(count)]
    names = [f"small.{i}" for i in range(count)]

    def hvd_side() -> None:
        handles = [
            hvd.allreduce_async_(t, op=hvd.Sum, name=n) for t, n in zip(ts, names, strict=True)
        ]
        for h in handles:
            hvd.synchronize(h)

    def raw_fused() -> None:
        flat = torch.cat(ts)
        dist.all_reduce(flat)
        for t, piece in zip(ts, flat.split(nbytes // 4), strict=True):
            t.copy_(piece)

    def raw_separate() -> None:
        for t in ts:
            dist.all_reduce(t)

    sides = {"hvd fused": hvd_side, "raw fused": raw_fused, "raw separate": raw_separate}
    # Batches per side and round (`reps`, --fusion-reps): one batch lasts a few ms, so a round of
    # one batch per side is decided by a single scheduling hiccup. With 1 the sides alternate
    # batch by batch, each starting with caches the other side used. The slow raw-separate side
    # is context only: one batch per round.
    per_side = {"hvd fused": reps, "raw fused": reps, "raw separate": 1}
    for fn in sides.values():
        fn()

    def reset() -> None:
        for t in ts:
            t.fill_(1.0)

    return _alternate(sides, per_side, rounds, dist.barrier, reset)


def _alternate(
    sides: dict[str, Callable[[], None]],
    per_side: dict[str, int],
    rounds: int,
    barrier: Callable[[], object],
    reset: Callable[[], None],
) -> dict[str, list[float]]:
    """Per side, one time a round (the median of its batches); the sides take turns going
    first, and `reset` runs after each round."""
    times: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(rounds):
        for key in list(sides) if r % 2 == 0 else list(reversed(sides)):
            batches = []
            for _ in range(per_side[key]):
                barrier()
                start = time.perf_counter()
                sides[key]()
                batches.append(time.perf_counter() - start)
            times[key].append(statistics.median(batches))
        reset()
    return times


def worker(
    sizes_mb: list[float], rounds: int, gc_freeze: bool = False, fusion_reps: int = 10
) -> dict[Any, dict[str, list[float]]]:
    import gc

    import torch
    import torch.distributed as dist

    import hora.torch as hvd

    hvd.init()
    if gc_freeze:
        gc.collect()
        gc.freeze()
    out: dict[Any, dict[str, list[float]]] = {}
    for mb in sizes_mb:
        n = int(mb * (1 << 20)) // 4
        t = torch.ones(n)
        calls = _calls_for(n * 4)
        sides = {
            LIMIT: MemoryLimit(torch.ones(n), hvd.rank(), hvd.size()),
            "raw in place": lambda t=t: dist.all_reduce(t),
            "hvd.allreduce_": lambda t=t: hvd.allreduce_(t, op=hvd.Sum, name="bench_"),
            "raw clone+all_reduce": lambda t=t: _raw_out_of_place(t),
            "hvd.allreduce": lambda t=t: hvd.allreduce(t, op=hvd.Sum, name="bench"),
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
    out["fusion"] = _fusion(rounds, fusion_reps)
    hvd.shutdown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 16, 64])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--gc-freeze", action="store_true")
    parser.add_argument(
        "--fusion-reps", type=int, default=10, help="200 x 4 KB batches per side and round"
    )
    parser.add_argument(
        "--no-shm",
        action="store_true",
        help="HORA_SHM=0: hora's allreduce on gloo too, as between hosts (like for like)",
    )
    args = parser.parse_args()
    env = {"HORA_SHM": "0"} if args.no_shm else {}
    results = hora.run(
        worker, (args.sizes_mb, args.rounds, args.gc_freeze, args.fusion_reps), np=2, env=env
    )[0]
    pairs = [
        ("in place", "raw in place", "hvd.allreduce_"),
        ("out of place", "raw clone+all_reduce", "hvd.allreduce"),
    ]
    print(
        f"{'size':>7} {'pair':>13} {'raw GB/s':>9} {'hvd GB/s':>9} {'hvd us':>9} {'ratio':>6}"
        f" {'ratio range':>12} {'of limit':>8}"
    )
    fusion = results.pop("fusion")
    for mb, times in results.items():
        limit = mb / 1024 / statistics.median(times[LIMIT])
        for label, raw_key, hvd_key in pairs:
            raw = mb / 1024 / statistics.median(times[raw_key])
            hvd = mb / 1024 / statistics.median(times[hvd_key])
            per_round = [r / h for r, h in zip(times[raw_key], times[hvd_key], strict=True)]
            print(
                f"{mb:>5g}MB {label:>13} {raw:>9.2f} {hvd:>9.2f} "
                f"{1e6 * statistics.median(times[hvd_key]):>9.1f} {hvd / raw:>5.2f}x "
                f"{min(per_round):>5.2f}-{max(per_round):.2f}x {hvd / limit:>7.2f}x"
            )
        of_limit = [m / h for m, h in zip(times[LIMIT], times["hvd.allreduce_"], strict=True)]
        print(
            f"{'':>7} {'memory limit':>13} {limit:>9.2f} GB/s; in place / limit per round: "
            f"median {statistics.median(of_limit):.2f}x, {min(of_limit):.2f}-{max(of_limit):.2f}x"
        )
    print("\n200 x 4 KB allreduces (ms per batch of 200: median of the rounds' medians, range)")
    for key, v in fusion.items():
        med, lo, hi = (1e3 * f(v) for f in (statistics.median, min, max))
        print(f"  {key:>13}: {med:8.2f}  {lo:.2f}-{hi:.2f}")
    per_round = [h / r for h, r in zip(fusion["hvd fused"], fusion["raw fused"], strict=True)]
    ratio = statistics.median(fusion["hvd fused"]) / statistics.median(fusion["raw fused"])
    mid = statistics.median(per_round)
    print(
        f"  hvd fused / raw fused: {ratio:.2f}x (per round: median {mid:.2f}x, "
        f"{min(per_round):.2f}-{max(per_round):.2f}x)"
    )


if __name__ == "__main__":
    main()
