"""Elastic runs (min_np/max_np): how many ranks the next attempt gets, and when to grow.

After a failed attempt the driver waits a settle time (a lost host's executors or node take a
moment to leave the cluster's count, a replacement a moment to join), then starts the next
attempt with as many ranks as the cluster can run now, at most `max_np`; below `min_np` it polls
until `start_timeout`, then gives up with the story. While an attempt runs below `max_np`, a
`FreeSlots` polls the same count; once more slots have stayed free for the settle time, the
driver asks the ranks to stop at their next commit and starts the next attempt, larger.
The ranks' side (commits that outlive them, the restore) is `hora.collectives.elastic`.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

SETTLE_ENV = "HORA_ELASTIC_SETTLE_SECONDS"
DEFAULT_SETTLE_SECONDS = 5.0
POLL_SECONDS = 1.0  # how often the cluster's count is read while waiting or growing

#: how many ranks of this job the cluster could run now, given the ranks the job holds
Capacity = Callable[[int], int]


def settle_seconds() -> float:
    """`HORA_ELASTIC_SETTLE_SECONDS` (default 5): how long a count must hold before it is used."""
    value = os.environ.get(SETTLE_ENV, "")
    try:
        return max(0.0, float(value)) if value else DEFAULT_SETTLE_SECONDS
    except ValueError:
        raise ValueError(f"{SETTLE_ENV}={value!r} is not a number of seconds") from None


def settle_given() -> bool:
    """Whether HORA_ELASTIC_SETTLE_SECONDS was set (an engine whose count is exact then waits
    it too; else it waits none)."""
    return bool(os.environ.get(SETTLE_ENV, ""))


class TooFewSlots(Exception):
    """The cluster stayed below min_np ranks for the whole wait; `seen` is its last count."""

    def __init__(self, seen: int, waited: float):
        super().__init__(seen, waited)
        self.seen = seen
        self.waited = waited


def _count(capacity: Capacity, held: int) -> int:
    """The count, or 0 while the cluster cannot be asked (a connection being rebuilt)."""
    with contextlib.suppress(Exception):
        return capacity(held)
    return 0


@dataclass
class Sizer:
    """Chooses the size of an elastic run's next attempt."""

    min_np: int
    max_np: int
    capacity: Capacity
    settle: float = field(default_factory=settle_seconds)
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def next_size(self, wait: float, settle: bool = True, want: int | None = None) -> int:
        """min(max_np, the cluster's count) once it reaches min_np, after `settle`; raises
        TooFewSlots after `wait` seconds below it. `want`: the count a growth was asked for,
        waited for up to the settle time (the stopped attempt's resources take a moment to
        leave its engine's reservations: Ray frees a removed placement group's asynchronously)."""
        began = self.clock()
        if settle:
            self.sleep(self.settle)
        while True:
            seen = _count(self.capacity, 0)
            patient = want is not None and seen < want and self.clock() - began < self.settle
            if seen >= self.min_np and not patient:
                return min(self.max_np, seen)
            waited = self.clock() - began
            if waited >= wait:
                raise TooFewSlots(seen, waited)
            self.sleep(min(POLL_SECONDS, max(0.0, wait - waited)))


#: whether the engine's count may be used at once while the attempt holds `held` ranks: every
#: slot its lost ranks held is known free (`hora.engines.Launcher.slots_settled`)
Settled = Callable[[int], bool]


def _never(held: int) -> bool:
    return False


class FreeSlots:
    """While an attempt of `np` ranks runs: `due()` turns True once, when the cluster could run
    more of them and has for `steady` seconds, or at once where `settled` says the count is
    true now (a lost rank's slot known free: no lost host's slots still counted in it)."""

    def __init__(
        self,
        np: int,
        capacity: Capacity,
        steady: float,
        poll: float = POLL_SECONDS,
        settled: Settled = _never,
    ) -> None:
        self.np = np
        self.capacity = capacity
        self.steady = steady
        self.poll = poll
        self.settled = settled
        self.seen = np
        self.fired = False
        self._since: float | None = None
        self._next_poll = 0.0

    def due(self, now: float) -> bool:
        if self.fired or now < self._next_poll:
            return False
        self._next_poll = now + self.poll
        self.seen = _count(self.capacity, self.np)
        if self.seen <= self.np:
            self._since = None
            return False
        if self._since is None:
            self._since = now
        self.fired = now - self._since >= self.steady or _settled(self.settled, self.np)
        return self.fired

    def anew(self, np: int) -> FreeSlots:
        """The same watch, from the start, for an attempt of `np` ranks (resized in place, or
        its growth given up): every setting kept, none to forget at the call."""
        return FreeSlots(np, self.capacity, self.steady, self.poll, self.settled)


def _settled(settled: Settled, held: int) -> bool:
    """Whether the count is true now; False while the engine cannot say (as `_count`)."""
    with contextlib.suppress(Exception):
        return settled(held)
    return False


@dataclass
class Growth:
    """The growth watch of an elastic attempt below `max_np` (`hora.job.attempt` judges it):
    its free slots' watch; whether the budget has an attempt left to grow into by a restart;
    whether the watch fired and new ranks were started in place."""

    watch: FreeSlots
    max_np: int
    restart: bool = True
    in_place: bool = False


def resumed(commit: int, size: int, known_commit: int) -> str:
    """What the driver says when an attempt's rank 0 restored commit `commit` (made by `size`
    ranks), the newest it knows of being `known_commit`."""
    made = f"{size} rank{'s' if size != 1 else ''}"
    said = f"the ranks resumed from commit {commit} (made by {made})"
    if commit < known_commit:  # the newest commit's hosts are not this attempt's
        said += (
            f", not from commit {known_commit}: no host of this attempt holds it (commits live "
            f"on the hosts that made them), so the steps after commit {commit} are trained again"
        )
    return said
