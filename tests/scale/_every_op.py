"""What the ranks of the real-scale jobs run (np 32 and 64 on one host, 32 ranks on 8 namespaced
hosts): every kind of op once, checked on every rank against sums it computes from its rank and
the world size (tests/collectives/_cases.py), then a run of small allreduces timed.

A world this size on 2 cores is oversubscribed many times: the cases are the ones whose every
collective is an op (no case that waits on purpose, fails a rank or compares paths at length).
"""

from __future__ import annotations

import os
import resource
import time
from typing import Any

import torch

# Every op kind the engine has, with its forms (async, in place, grouped), a process set and
# join; `allreduce_path` checks which data path an allreduce took (shared memory on one host,
# the hierarchical path across several).
OP_CASES = [
    "basics",
    "allreduce_ops",
    "allreduce_path",
    "allreduce_inplace_and_async",
    "grouped_allreduce",
    "allgather_uneven",
    "grouped_allgather",
    "broadcast_forms",
    "alltoall_forms",
    "reducescatter_forms",
    "process_sets",
    "barrier_and_join",
]


def every_op(allreduces: int = 20) -> dict[str, Any]:
    """`OP_CASES` on this rank ({case: "ok" | the failure}), then `allreduces` allreduces of
    1,024 floats, each checked, timed from a barrier: the seconds per allreduce as this rank
    saw them, the hosts the hierarchical path grouped the ranks into (None on one host), and
    this rank's peak RSS in MiB."""
    import hora.torch as hvd
    from hora.collectives._control import state as _state
    from tests.collectives import _cases

    outcomes = _cases.run_all(OP_CASES)
    hvd.init()
    hierarchy = _state.get().groups[0].hierarchy
    n = hvd.size()
    want = torch.full((1024,), float(n * (n + 1) // 2))
    hvd.barrier()
    began = time.perf_counter()
    wrong = 0
    for _ in range(allreduces):
        got = hvd.allreduce(torch.full((1024,), hvd.rank() + 1.0), op=hvd.Sum, name="timed")
        wrong += not torch.equal(got, want)
    seconds = (time.perf_counter() - began) / allreduces
    if wrong:
        outcomes["timed_allreduces"] = f"{wrong} of {allreduces} allreduces gave a wrong sum"
    hvd.shutdown()
    return {
        "rank": int(os.environ["RANK"]),
        "cases": outcomes,
        "allreduce_s": seconds,
        "hierarchy_hosts": None if hierarchy is None else hierarchy.hosts,
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def failures(results: list[dict[str, Any]]) -> dict[tuple[int, str], str]:
    """(rank, case) -> what failed, over every rank's `every_op` result."""
    return {
        (r["rank"], case): text
        for r in results
        for case, text in r["cases"].items()
        if text != "ok"
    }
