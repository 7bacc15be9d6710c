"""torch.distributed's default group for a hora world: the attempt's first by `env://`, a world
re-formed in place through the launcher's same store under a prefix of its own.

Every world re-formed in place has a generation (the driver counts them, `Reform`); its keys
live under `hora/reform/<generation>/`, so no key of an older world is read again. A rank started
to grow a running world (it has the generation in its environment) says so to the driver
(`Joining`) and waits for the world to open: the running ranks open it when they reach the
commit where they re-form, which may be a while (one commit interval), longer than the group's
own timeout should be.

Before the group itself is made, every rank of a re-formed world marks itself present under the
prefix and waits for all the others, a few milliseconds at a time: a rank lost meanwhile would
leave torch's rendezvous waiting for ever, so while it waits a rank reads the driver's newer
word (a world without the lost rank, `Superseded`) and re-forms that one instead.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from hora.environment import RankEnvironment
from hora.wire import link
from hora.wire.protocol import Joining, Reform

OPEN_KEY = "open"  # set by the running ranks of a world re-formed in place as they join it
#: how long a new rank waits for the running ones to reach their commit; the driver stops it
#: sooner when the attempt ends without them
JOIN_WAIT = timedelta(days=1)
PRESENT_POLL_SECONDS = 0.02


class Superseded(Exception):
    """The driver ordered a newer world (`order`) while this one was still forming."""

    def __init__(self, order: Reform) -> None:
        super().__init__(f"world {order.generation} ordered while an older one formed")
        self.order = order


def backend() -> str:
    """gloo for CPU tensors, and NCCL for CUDA ones where there is a GPU."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def init_default_group(here: RankEnvironment, wait: timedelta, opening: bool = False) -> None:
    """Make this process rank `here.rank` of the default group of its world: by env:// for the
    attempt's first world; else through the store under the world's prefix, where `opening`
    (a running rank re-forming) lets the waiting new ranks in, and a new rank waits for that."""
    rank, size = here.rank, here.size
    assert rank is not None and size is not None
    if not here.generation:
        dist.init_process_group(backend(), init_method="env://", rank=rank, world_size=size)
        return
    addr, port = here.master_addr, here.master_port
    if not addr or port is None:
        raise RuntimeError("a world re-formed in place needs the launcher's MASTER_ADDR/PORT")
    client = dist.TCPStore(addr, port, is_master=False, timeout=wait)
    store = dist.PrefixStore(f"hora/reform/{here.generation}/", client)
    if opening:
        store.set(OPEN_KEY, "1")
    else:
        driver = link.current()
        if driver is not None:
            driver.send(Joining(driver.rank))
        store.wait([OPEN_KEY], JOIN_WAIT)
    _all_present(store, rank, size, here.generation, wait)
    dist.init_process_group(backend(), store=store, rank=rank, world_size=size, timeout=wait)


def _all_present(store: dist.Store, rank: int, size: int, generation: int, wait: timedelta) -> None:
    """Mark this rank present and wait until every rank of the world is; raise `Superseded`
    when the driver orders a newer world meanwhile (a rank of this one was lost)."""
    store.set(f"present/{rank}", "1")
    keys = [f"present/{r}" for r in range(size)]
    deadline = time.monotonic() + wait.total_seconds()
    while not store.check(keys):
        newer = link.wait_reform(generation, PRESENT_POLL_SECONDS)
        if newer is not None:
            raise Superseded(newer)
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the world re-formed in place as generation {generation} did not gather its "
                f"{size} ranks within {wait.total_seconds():g} s"
            )
