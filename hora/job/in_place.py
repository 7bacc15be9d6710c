"""An elastic attempt that shrinks in place: a lost rank stops no survivor.

Horovod's elastic mode resets its survivors in place; hora's local and Ray engines do the same
for jobs in `hvd.elastic.run` (torch), whose ranks say so (`InPlace`). When every lost rank is
gone without a word of its own (a kill, a crash, a lost host: not the job's exception, which
would fail again) and enough survivors are left, the monitor does not fail the attempt: the
survivors are renumbered in rank order and each is told its place (`Reform`); their
`hvd.elastic.run` re-forms the world, restores the last in-memory commit and syncs it from the
new rank 0, and rank 0 says when training goes on (`Reformed`). The ranks keep naming
themselves by the rank they started as; `Renumbering` maps that to the rank now.

A rank is gone when its engine saw its process exit, or saw what ran it end (a Ray actor, with
its node or alone); a rank whose channel closed without its last word is lost too (its process
ended: on a lost host, before the engine says why). A rank only silent (a cut-off host) may live
on, so its attempt restarts. The lost ranks' channels are closed: a worker that outlived its
actor kills itself, and trains on in no world.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from hora import environment
from hora.wire.channel import Connection
from hora.wire.protocol import (
    EngineFailed,
    Error,
    Exited,
    Heartbeat,
    Hello,
    InPlace,
    Joining,
    Metrics,
    Output,
    Reform,
    Reformed,
    Resized,
    Result,
    Stacks,
)

#: what names its sender (or, from the launcher, its process) by the rank it started as
FROM_A_RANK = (
    *(Hello, Heartbeat, Output, Result, Error, Exited, EngineFailed, Metrics, Stacks),
    *(Resized, InPlace, Joining),
)


class _Failure(Protocol):
    rank: int
    reported: bool
    time: float
    by_engine: bool

    def headline(self) -> str: ...


class Watched(Protocol):
    """What of the monitor (`hora.job.monitor.Monitor`) a resize in place rewrites."""

    np: int
    started: dict[int, str]
    connections: dict[int, Connection]
    last_heard: dict[int, float]
    tails: dict[int, Any]
    results: dict[int, bytes | None]
    exits: dict[int, int]
    closed: set[int]
    resized: dict[int, int]
    failures: dict[int, Any]
    stall: str | None
    stuck: tuple[int, ...]


class Renumbering:
    """The ranks of one attempt as first started and as numbered now; `min_np` None: the
    attempt never shrinks in place (a lost rank fails it, as before)."""

    def __init__(self, np: int, min_np: int | None) -> None:
        self.min_np = min_np
        self.now: dict[int, int] = {r: r for r in range(np)}  # first rank -> rank now
        self.in_place: set[int] = set()  # ranks (now) whose hvd.elastic.run can re-form
        self.cannot: set[int] = set()  # ... and those whose hvd.elastic.run said it cannot
        self.generation = 0  # worlds re-formed in place so far
        self.reforming: tuple[float, int, str] | None = None  # (since, from np, why)

    def first(self, rank: int) -> int:
        """The rank (as first started) of the process that is rank `rank` now."""
        return next(first for first, now in self.now.items() if now == rank)

    def translate(self, message: Any) -> Any:
        """`message` with the rank now; None for a rank lost to a re-formed world."""
        if not isinstance(message, FROM_A_RANK):
            return message
        rank = self.now.get(message.rank)
        if rank is None:
            return None
        return message._replace(rank=rank)

    def report(self, message: Any) -> Any:
        """Take the ranks' word on re-forming: what the monitor hands its callbacks of it (a
        `ResizedInPlace` for a `Reformed`), None for nothing; any other `message` as it is."""
        match message:
            case InPlace(rank=rank, able=able):
                (self.in_place if able else self.cannot).add(rank)
                return None
            case Reformed(generation=generation, size=size, commit=commit):
                return self._reformed(generation, size, commit)
        return message

    def possible(self, watched: Watched, finished: Callable[[int], bool]) -> bool:
        """Every failed rank is gone without a word of its own, every other rank runs in a
        re-formable hvd.elastic.run, and at least min_np of them are left."""
        if self.min_np is None:
            return False
        failures: list[_Failure] = list(watched.failures.values())
        lost = _lost(watched)
        survivors = [r for r in range(watched.np) if r not in lost]
        return (
            len(survivors) >= self.min_np
            and all(not f.reported and (f.rank in watched.exits or f.by_engine) for f in failures)
            and all(r in self.in_place and not finished(r) for r in survivors)
        )

    def reform(self, watched: Watched, since: float) -> None:
        """Renumber the survivors (in rank order) and tell each its place in the new world."""
        failures: list[_Failure] = sorted(watched.failures.values(), key=lambda f: f.time)
        lost = _lost(watched)
        survivors = [r for r in range(watched.np) if r not in lost]
        why = _why(watched, failures, lost, survivors)
        for rank in lost:  # one that outlived its actor hears the channel close, and dies
            conn = watched.connections.get(rank)
            if conn is not None:
                conn.close()
        new = {old: index for index, old in enumerate(survivors)}
        before = watched.np
        self.now = {first: new[now] for first, now in self.now.items() if now in new}
        self.in_place = {new[r] for r in self.in_place if r in new}
        self.cannot = set()  # every survivor could
        self.generation += 1
        self.reforming = (since, before, why)

        def kept(values: dict[int, Any]) -> dict[int, Any]:
            return {new[r]: v for r, v in values.items() if r in new}

        watched.np = len(survivors)
        watched.started, watched.connections = kept(watched.started), kept(watched.connections)
        watched.last_heard, watched.tails = kept(watched.last_heard), kept(watched.tails)
        watched.results, watched.exits = kept(watched.results), kept(watched.exits)
        watched.closed = {new[r] for r in watched.closed if r in new}
        watched.failures, watched.stall, watched.stuck = {}, None, ()
        places = environment.placements([watched.started[r] for r in range(watched.np)])
        for rank, conn in watched.connections.items():
            with contextlib.suppress(OSError):
                conn.send(reform_order(places[rank], self.generation))
        say(
            f"resizing in place from {before} to {watched.np} ranks ({why}); the survivors keep "
            "their processes"
        )

    def _reformed(self, generation: int, size: int, commit: int) -> ResizedInPlace | None:
        if self.reforming is None or generation != self.generation:
            return None
        since, before, why = self.reforming
        self.reforming = None
        seconds = time.time() - since
        say(
            f"resized in place from {before} to {size} ranks in {seconds:.1f} s "
            f"({why}); the ranks went on from commit {commit}"
        )
        return ResizedInPlace(before, size, seconds, commit, why)


class ResizedInPlace(NamedTuple):
    """The driver's own record for its callbacks (the timeline): a world re-formed in place
    went on from commit `commit`, `seconds` after the driver decided it."""

    before: int
    size: int
    seconds: float
    commit: int
    why: str


def _lost(watched: Watched) -> set[int]:
    """The failed ranks, and those whose channel closed without their last word (a result, a
    stop to grow): their process ended, though the engine may not have said why yet."""
    quiet = watched.closed - set(watched.results) - set(watched.resized)
    return set(watched.failures) | quiet


def _why(watched: Watched, failures: list[_Failure], lost: set[int], survivors: list[int]) -> str:
    """The first failure, the other lost ranks, and the hosts none of whose ranks are left."""
    others = sorted(lost - {failures[0].rank})
    also = f"; also lost: rank{'s' if len(others) > 1 else ''} " if others else ""
    also += ", ".join(map(str, others))
    left = {watched.started.get(r) for r in survivors}
    hosts = sorted({h for r in lost if (h := watched.started.get(r)) and h not in left})
    where = f"lost {', '.join(hosts)}: " if hosts else ""
    return f"{where}{failures[0].headline()}{also}"


def reform_order(place: environment.RankPlacement, generation: int) -> Reform:
    """The driver's word to a rank: its place in the world re-formed as `generation`."""
    p = place
    return Reform(
        p.rank, p.size, p.local_rank, p.local_size, p.cross_rank, p.cross_size, generation
    )


def say(text: str) -> None:
    print(f"hora: {text}", file=sys.stderr, flush=True)
