"""gloo's full mesh at start: what a world's start costs against N, with gloo's pairs connected
at once (torch's default) or on first use (`TORCH_GLOO_LAZY_INIT=1`), and what the first
collectives cost after it.

Real jobs (`--sizes`): each rank of a real hora job (the local engine, `np` processes on this
machine) times, once every rank has imported torch: torch's default group
(`init_process_group("gloo")`: a full mesh, every rank connected to every other, N (N - 1) / 2
pairs), `hvd.init()` on top of it (hora's own world group, another mesh, its negotiation tree
and shared memory), then a first and a second allreduce of one float. The slowest rank's figure
is the world's; each setting alternates with the other, `--reps` times.

Simulated meshes (`--simulate`): N gloo groups made in one process, a thread per rank, over a
store that counts each rank's operations; a group's start, the store operations it costs a
rank, and the first two allreduces. Every pair's connection is made on this machine's 2 cores,
so the times grow faster than on a cluster, where each rank makes its own; the store's count is
what a cluster's one TCPStore would serve (N times it).

    .venv/bin/python bench/gloo_init.py [--sizes 2 4 8 16] [--reps 2] [--simulate 16 32 64 96]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from datetime import timedelta

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.distributed as dist

import hora

STEPS = ("default_group", "hvd_init", "first_allreduce", "second_allreduce")


def start_job() -> dict[str, float]:
    import hora.torch as hvd

    _all_here(int(os.environ["WORLD_SIZE"]))
    marks = [time.perf_counter()]
    dist.init_process_group("gloo", init_method="env://")
    marks.append(time.perf_counter())
    hvd.init()
    marks.append(time.perf_counter())
    for _ in range(2):
        hvd.allreduce(torch.ones(1), op=hvd.Sum)
        marks.append(time.perf_counter())
    hvd.shutdown()
    return {step: marks[i + 1] - marks[i] for i, step in enumerate(STEPS)}


def _all_here(np: int) -> None:
    """Wait until every rank has imported torch, so that no step's time is another rank's
    late start (a barrier on the launcher's store, under a key of the bench's own)."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    store.add("bench/here", 1)
    while store.add("bench/here", 0) < np:
        time.sleep(0.001)


def world(np: int, lazy: bool) -> dict[str, float]:
    """The slowest rank's time for each step."""
    env = {"TORCH_GLOO_LAZY_INIT": "1" if lazy else "0"}
    per_rank = hora.run(start_job, np=np, env=env)
    return {step: max(r[step] for r in per_rank) for step in STEPS}


class _Counting(dist.Store):
    """A store that counts the operations made on it (gloo's C++ calls them through Python)."""

    def __init__(self, inner: dist.Store) -> None:
        super().__init__()
        self.inner = inner
        self.ops = 0
        self._lock = threading.Lock()

    def _count(self) -> None:
        with self._lock:
            self.ops += 1

    def set(self, key, value):  # type: ignore[no-untyped-def]
        self._count()
        return self.inner.set(key, value)

    def get(self, key):  # type: ignore[no-untyped-def]
        self._count()
        return self.inner.get(key)

    def add(self, key, value):  # type: ignore[no-untyped-def]
        self._count()
        return self.inner.add(key, value)

    def wait(self, keys, timeout=None):  # type: ignore[no-untyped-def]
        self._count()
        return self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

    def check(self, keys):  # type: ignore[no-untyped-def]
        self._count()
        return self.inner.check(keys)

    def num_keys(self):  # type: ignore[no-untyped-def]
        return self.inner.num_keys()


def _in_threads(n: int, work) -> float:  # type: ignore[no-untyped-def]
    threads = [threading.Thread(target=work, args=(r,)) for r in range(n)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - began


def simulated_mesh(n: int, lazy: bool) -> dict[str, float]:
    """N ranks' gloo groups in this process: start, store operations a rank, first allreduces."""
    os.environ["TORCH_GLOO_LAZY_INIT"] = "1" if lazy else "0"
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    stores = [
        _Counting(dist.PrefixStore("mesh/", dist.TCPStore("127.0.0.1", server.port)))
        for _ in range(n)
    ]
    groups: list = [None] * n

    def make(rank: int) -> None:
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timedelta(seconds=300)
        options._devices = [dist.ProcessGroupGloo.create_device(interface="lo")]
        groups[rank] = dist.ProcessGroupGloo(stores[rank], rank, n, options)

    def allreduce(rank: int) -> None:
        groups[rank].allreduce([torch.ones(1)]).wait()

    start = _in_threads(n, make)
    ops_start = sum(s.ops for s in stores) / n
    first = _in_threads(n, allreduce)
    ops_first = sum(s.ops for s in stores) / n - ops_start
    second = _in_threads(n, allreduce)
    groups.clear()
    os.environ.pop("TORCH_GLOO_LAZY_INIT")
    return {
        "start_s": start,
        "store_ops_per_rank": ops_start,
        "first_allreduce_s": first,
        "first_store_ops_per_rank": ops_first,
        "second_allreduce_s": second,
    }


def simulate(sizes: list[int]) -> None:
    for n in sizes:
        got = {lazy: simulated_mesh(n, lazy) for lazy in (False, True)}
        for lazy, m in got.items():
            print(
                f"simulated n={n:4d} {'lazy ' if lazy else 'eager'}  start {m['start_s']:.3f} s"
                f" ({m['store_ops_per_rank']:.0f} store ops a rank)"
                f"  first allreduce {m['first_allreduce_s']:.3f} s"
                f" (+{m['first_store_ops_per_rank']:.0f} ops)"
                f"  second {m['second_allreduce_s']:.4f} s",
                flush=True,
            )
        eager, lazy_ = got[False], got[True]
        total = (eager["start_s"] + eager["first_allreduce_s"]) / (
            lazy_["start_s"] + lazy_["first_allreduce_s"]
        )
        print(f"simulated n={n:4d} start + first allreduce, eager / lazy {total:.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--simulate", type=int, nargs="*", default=[16, 32, 64, 96])
    args = parser.parse_args()
    print(f"1-minute load average at the start: {os.getloadavg()[0]:.1f}; {os.cpu_count()} cores")
    simulate(args.simulate)
    for np in args.sizes:
        runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for _ in range(args.reps):
            for lazy in (False, True):
                runs[lazy].append(world(np, lazy))
        medians = {
            lazy: {s: statistics.median(r[s] for r in got) for s in STEPS}
            for lazy, got in runs.items()
        }
        for lazy in (False, True):
            m = medians[lazy]
            print(
                f"np={np:3d} {'lazy ' if lazy else 'eager'}"
                f"  default group {m['default_group']:.3f} s  hvd.init {m['hvd_init']:.3f} s"
                f"  first allreduce {m['first_allreduce']:.4f} s"
                f"  second {m['second_allreduce']:.4f} s",
                flush=True,
            )
        eager, lazy = medians[False], medians[True]
        start = (eager["default_group"] + eager["hvd_init"]) / max(
            1e-9, lazy["default_group"] + lazy["hvd_init"]
        )
        first = lazy["first_allreduce"] / max(1e-9, eager["first_allreduce"])
        print(
            f"np={np:3d} start eager / lazy {start:.2f}x; first allreduce lazy / eager {first:.2f}x"
        )


if __name__ == "__main__":
    main()
