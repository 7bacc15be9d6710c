"""Jobs whose ranks stall on purpose: they submit collectives under different names or skip one.

Run by tests/collectives/test_stall.py, under hora's launcher or as bare ranks (torchrun's
variables).
"""

from __future__ import annotations

import os
import sys
import time

import torch

import hora.torch as hvd

NAMES = {0: "x", 1: "y"}  # rank 2, where there is one, submits nothing until the stall is over


def _write(path: str, text: str) -> None:
    with open(f"{path}.tmp", "w") as f:
        f.write(text)
    os.replace(f"{path}.tmp", path)


def _wait_for(*paths: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(f"none of {paths} appeared within {limit:g} s")
        time.sleep(0.05)


def shut_down_by_stall(path: str) -> None:
    """Ranks 0 and 1 wait in allreduces of different names; rank 2 is in no collective until rank 0
    has been stopped, then meets the shutdown at its next one. Each writes what it caught to
    `path.<rank>`, waits for the others to have written theirs, then raises it."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    try:
        if r not in NAMES:
            _wait_for(f"{path}.0")
        hvd.allreduce(torch.ones(1), name=NAMES.get(r, "z"))
        error: Exception = RuntimeError("the stalled allreduce returned")
    except hvd.HorovodInternalError as exc:
        error = exc
    _write(f"{path}.{r}", f"{type(error).__name__}: {error}")
    _wait_for(*(f"{path}.{k}" for k in range(n)))
    raise error


def stalled_until_timeout() -> None:
    """Rank 0 waits in an allreduce that rank 1 never submits; the job's timeout ends it."""
    hvd.init()
    if hvd.rank() == 0:
        hvd.allreduce(torch.ones(1), name="x")
    time.sleep(120)


def late_rank(delay: float) -> float:
    """Rank 1 submits rank 0's allreduce `delay` seconds late; it completes nonetheless."""
    hvd.init()
    if hvd.rank() == 1:
        time.sleep(delay)
    out = hvd.allreduce(torch.ones(1), name="late", op=hvd.Sum).item()
    hvd.shutdown()
    return out


def bare_rank() -> None:
    """A rank started with torchrun's variables: prints what its stalled allreduce raised."""
    hvd.init()
    try:
        hvd.allreduce(torch.ones(1), name=NAMES[hvd.rank()])
        print("no error", flush=True)
    except hvd.HorovodInternalError as exc:
        print(f"HorovodInternalError: {exc}", flush=True)


if __name__ == "__main__":
    globals()[sys.argv[1]]()
