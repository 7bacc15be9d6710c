"""A rank's half of an elastic run's talk with its driver, the twin of `hora.job.world` (the
driver's half, which decides the world; `hora.job.in_place` carries it out).

What the rank hears: the driver's order to re-form its world in place (`Reform`: after a lost
rank, or to grow with new ranks) and its word that more slots are free (`HostsUpdated`), which
the bootstrap's channel thread hands to `hear`. What it says: whether it can re-form in place
(`InPlace`), that it waits to join a running world (`Joining`), that a world gathered
(`Formed`), that it re-formed (`Reformed`) or resumed from a commit (`Resumed`), and, raising
`ResizeExit`, that it ends at a commit for the run to restart at another size (`Resized`).

Outside a hora worker (no `hora.wire.link`) it hears nothing and says nothing, so the same
training code runs in a plain process. Horovod's elastic API (State, commits, the retry loop) is
`hora.collectives.elastic`; the collectives reach this module through their one hook to the
driver (`collectives._driver`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator

from hora import environment
from hora.wire import link
from hora.wire.protocol import Formed, HostsUpdated, InPlace, Joining, Reform, Reformed, Resumed

log = logging.getLogger(__name__)

#: how long a rank whose collective failed waits for the driver's word to re-form in place
#: before it resets in its own world (no rank was lost, or the engine cannot re-form)
REFORM_WAIT_ENV = "HORA_ELASTIC_REFORM_WAIT_SECONDS"
DEFAULT_REFORM_WAIT = 10.0
#: what the driver said of growing, for a rank in a given world: nothing (or a growth already
#: done), a restart at the new size, or a larger world that new ranks wait in
GROW_BY_RESTART, GROW_IN_PLACE = 1, 2


class ResizeExit(BaseException):
    """Ends a rank of an elastic run cleanly at commit `commit`, so that the driver starts the
    run again at another size (raised by hvd.elastic's run; the bootstrap reports it)."""

    def __init__(self, commit: int):
        super().__init__(commit)
        self.commit = commit


class _Heard:
    """What the driver said of this rank's world on one link (a new link hears afresh)."""

    def __init__(self, driver: link.DriverLink) -> None:
        self.driver = driver
        #: set when the driver says that an elastic run has more slots (HostsUpdated) ...
        self.hosts_updated = threading.Event()
        #: ... and, > 0, the world re-formed in place that new ranks wait in (not a restart)
        self.grow_into = 0
        #: the driver's latest word to re-form the world in place (`Reform`), and when it came
        self.reform: Reform | None = None
        self.reform_came = threading.Condition()
        #: told of each `Reform` as it comes, on the channel's thread (`watching_reforms`)
        self.watchers: list[Callable[[Reform], None]] = []


_heard: _Heard | None = None
_heard_lock = threading.Lock()


def _now() -> _Heard | None:
    """What the driver of this worker's link said; None outside a hora worker."""
    global _heard
    driver = link.current()
    if driver is None:
        return None
    with _heard_lock:
        if _heard is None or _heard.driver is not driver:
            _heard = _Heard(driver)
        return _heard


def hear(message: HostsUpdated | Reform) -> None:
    """The driver's word (the bootstrap's channel thread calls this): more slots are free, in
    world `message.generation` > 0 where new ranks wait to join the running ones at their next
    commit; or re-form the world in place."""
    heard = _now()
    if heard is None:
        return
    if isinstance(message, HostsUpdated):
        heard.grow_into = message.generation
        heard.hosts_updated.set()
        return
    with heard.reform_came:
        heard.reform = message
        heard.reform_came.notify_all()
        watchers = list(heard.watchers)
    for watcher in watchers:
        with contextlib.suppress(Exception):  # the channel's thread must go on reading
            watcher(message)


@contextlib.contextmanager
def watching_reforms(watcher: Callable[[Reform], None]) -> Iterator[None]:
    """Call `watcher` with each `Reform` that comes while the block runs, on the channel's
    thread (a rank blocked in a store's wait cannot look itself); nothing outside a worker."""
    heard = _now()
    if heard is None:
        yield
        return
    with heard.reform_came:
        heard.watchers.append(watcher)
    try:
        yield
    finally:
        with heard.reform_came:
            heard.watchers.remove(watcher)


def wait_reform(after: int, timeout: float) -> Reform | None:
    """The driver's `Reform` of a generation past `after`, waiting up to `timeout` seconds for
    it; None outside a hora worker or when none came (no rank was lost: Horovod's own reset
    follows)."""
    heard = _now()
    if heard is None:
        return None
    with heard.reform_came:
        heard.reform_came.wait_for(
            lambda: heard.reform is not None and heard.reform.generation > after, timeout
        )
        reform = heard.reform
    return reform if reform is not None and reform.generation > after else None


def hosts_updated() -> bool:
    """Whether the driver has said, in this rank, that the elastic run can grow."""
    heard = _now()
    return heard is not None and heard.hosts_updated.is_set()


def growth_word(world: int) -> int:
    """What the driver said of growing, for a rank in world `world` (its generation): 0
    nothing (or a growth into this world or an older one, already done), GROW_BY_RESTART, or
    GROW_IN_PLACE (new ranks wait in a later world)."""
    heard = _now()
    if heard is None or not heard.hosts_updated.is_set():
        return 0
    into = heard.grow_into
    if not into:
        return GROW_BY_RESTART
    return GROW_IN_PLACE if into > world else 0


def grown(world: int) -> None:
    """This rank re-formed into world `world` to grow: the driver's word for it is spent (a
    word that arrives late is read as spent too, by `growth_word`)."""
    heard = _now()
    if heard is not None and 0 < heard.grow_into <= world:
        heard.hosts_updated.clear()


# ----- the world this process is in, and what it says of it -------------------------------------
_generation = 0  # the last re-formed world this process joined


def generation() -> int:
    """The world this process is in: 0 for an attempt's first, else the last re-formed one."""
    return _generation


def begin() -> None:
    """A rank's start in hvd.elastic's run: the world its environment names (a first world
    re-formed as it gathered, or one grown in place, has a generation too)."""
    global _generation
    _generation = environment.current().generation


def announce_in_place(able: bool, grows: bool = False) -> bool:
    """Tell the driver whether this rank can re-form in place (`able`: its state and group
    allow it; and in place is not turned off), so that it grows the run in place or by a
    restart; False where it cannot, or outside an elastic hora run."""
    driver = link.current()
    if driver is None or not environment.current().elastic:
        return False
    able = able and os.environ.get(environment.IN_PLACE_VAR, "1") != "0"
    driver.send(InPlace(driver.rank, able, able and grows))
    return able


def await_reform() -> Reform | None:
    """The driver's order to re-form, if a rank was lost; None after the wait: the rank resets."""
    global _generation
    wait = float(os.environ.get(REFORM_WAIT_ENV) or DEFAULT_REFORM_WAIT)
    began = time.monotonic()
    order = wait_reform(_generation, wait)
    if order is not None:
        _generation = order.generation
        log.warning(
            "re-forming in place as rank %d of %d (after %.1f s)",
            order.place.rank,
            order.place.size,
            time.monotonic() - began,
        )
    return order


def reformed(world: int) -> None:
    """This process re-formed into world `world` (it may be newer than the order it awaited:
    the driver ordered another while that one gathered)."""
    global _generation
    _generation = max(_generation, world)


def say_reformed(size: int, commit: int) -> None:
    """Rank 0's word that the world re-formed, with `size` ranks, from commit `commit`."""
    link.send_to_driver(Reformed(0, _generation, size, commit))


def say_resumed(commit: int, size: int) -> None:
    """Rank 0's word that the run resumed from commit `commit`, made by `size` ranks."""
    link.send_to_driver(Resumed(0, commit, size))


def say_joining() -> None:
    """A new rank's word that it waits for the running ones to open the world it joins."""
    driver = link.current()
    if driver is not None:
        driver.send(Joining(driver.rank))


def say_formed(world: int) -> None:
    """Tell the driver world `world` gathered: a rank lost from here on fails the others'
    collectives (or, in the first world, their rendezvous: every rank then restarts)."""
    driver = link.current()
    if driver is not None:
        with contextlib.suppress(OSError):
            driver.send(Formed(driver.rank, world))
