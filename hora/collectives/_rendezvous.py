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

import contextlib
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from hora import environment
from hora.environment import RankEnvironment
from hora.wire import link
from hora.wire.protocol import Formed, Joining, Reform

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


def default_transports() -> str:
    """The default group's transports (torch.distributed's `backend`): gloo for CPU tensors,
    and NCCL for CUDA ones where there is a GPU."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


_started_to_grow = False  # this process started as a new rank of a world grown in place


def started_to_grow() -> bool:
    """Whether this process started as a new rank of a running world grown in place (it takes
    the running ranks' state, not a commit)."""
    return _started_to_grow


def init_default_group(here: RankEnvironment, wait: timedelta, opening: bool = False) -> None:
    """Make this process rank `here.rank` of the default group of its world: by env:// for the
    attempt's first world; else through the store under the world's prefix, where `opening`
    (a running rank re-forming) lets the waiting new ranks in, and a new rank waits for that.
    Where the driver orders a newer world while this one gathers (a rank of it was lost), that
    world, as its place there says."""
    global _started_to_grow
    _started_to_grow = _started_to_grow or bool(here.generation and not opening)
    while True:
        try:
            _make_default_group(here, wait, opening)
            return
        except Superseded as newer:
            here, opening = take(newer.order), True


def take(order: Reform) -> RankEnvironment:
    """Write the place `order` gives this process, and its world's generation, where `init()`
    and the user's code read them."""
    os.environ.update(environment.placement_env(order.place))
    os.environ[environment.GENERATION_VAR] = str(order.generation)
    return environment.current()


def _make_default_group(here: RankEnvironment, wait: timedelta, opening: bool) -> None:
    rank, size = here.rank, here.size
    assert rank is not None and size is not None
    if not here.generation:
        if _first_world_may_re_form(here):  # lost ranks' survivors may still hear of a smaller
            _all_present(_store(here, 0, wait), rank, size, 0, wait)
        _formed(0)
        dist.init_process_group(
            default_transports(), init_method="env://", rank=rank, world_size=size
        )
        return
    store = _store(here, here.generation, wait)
    if opening:
        store.set(OPEN_KEY, "1")
    else:
        driver = link.current()
        if driver is not None:
            driver.send(Joining(driver.rank))
        store.wait([OPEN_KEY], JOIN_WAIT)
    _all_present(store, rank, size, here.generation, wait)
    _formed(here.generation)
    dist.init_process_group(
        default_transports(), store=store, rank=rank, world_size=size, timeout=wait
    )


def _first_world_may_re_form(here: RankEnvironment) -> bool:
    """An elastic hora run's first world, with the launcher's store and in place allowed."""
    allowed = os.environ.get(environment.IN_PLACE_VAR, "1") != "0"
    return here.elastic and allowed and bool(here.master_addr) and here.master_port is not None


def _store(here: RankEnvironment, generation: int, wait: timedelta) -> dist.Store:
    """The launcher's store, under the prefix of the world of `generation`."""
    addr, port = here.master_addr, here.master_port
    if not addr or port is None:
        raise RuntimeError("a world re-formed in place needs the launcher's MASTER_ADDR/PORT")
    client = dist.TCPStore(addr, port, is_master=False, timeout=wait)
    return dist.PrefixStore(f"hora/reform/{generation}/", client)


def _formed(generation: int) -> None:
    """Tell the driver this world gathered: a rank lost from here on fails the others'
    collectives (or, in the first world, their rendezvous: every rank then restarts)."""
    driver = link.current()
    if driver is not None:
        with contextlib.suppress(OSError):
            driver.send(Formed(driver.rank, generation))


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
