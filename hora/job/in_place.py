"""Carrying out the world's decisions (`hora.job.world`) on one attempt: the ranks' channels,
the engine, and the monitor's records of each process.

Horovod's elastic mode resets its survivors in place; hora does the same for jobs in
`hvd.elastic.run` (torch, TensorFlow) on engines that keep a lost rank's survivors running
(`Capabilities.reforms_in_place`). A world re-formed (`ReformWorld`) sends each rank its place
(`Reform`): after a loss the survivors, renumbered in rank order, re-form at once from the last
in-memory commit; to grow, the running ranks re-form at their next commit (`HostsUpdated`)
with new ranks that the engine started beforehand (`StartJoiners`, `Launcher.add`) and that
wait at that world's rendezvous (`Joining`). Rank 0 says when training goes on (`Reformed`).
Ranks name themselves by their process's id, which they keep: the monitor's records are by
process (`hora.job.records`), and a re-form renames nothing.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from hora import environment, placement
from hora.job.records import Records
from hora.job.world import Abandon, Loss, ReformWorld, StartJoiners, World
from hora.wire.channel import Connection
from hora.wire.protocol import (
    EngineFailed,
    Error,
    Exited,
    Formed,
    Heartbeat,
    Hello,
    HostsUpdated,
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

#: what names its sender (or, from the launcher, its process) by its process's id
FROM_A_RANK = (
    *(Hello, Heartbeat, Output, Result, Error, Exited, EngineFailed, Metrics, Stacks),
    *(Resized, InPlace, Joining, Formed),
)


class GrowingInPlace(NamedTuple):
    """The driver's own record for its callbacks (the timeline): new ranks were started."""

    before: int
    size: int
    why: str


class ResizedInPlace(NamedTuple):
    """The driver's own record for its callbacks (the timeline): a world re-formed in place
    went on from commit `commit`, `seconds` after the driver decided it."""

    before: int
    size: int
    seconds: float
    commit: int
    why: str


def hear(world: World, message: Any) -> Any:
    """The ranks' word on their world (each names its process), to the world: what it decided
    (a `ReformWorld` once every new rank waits), the record for the callbacks of a `Reformed`,
    None for nothing more; any other `message` as is."""
    match message:
        case InPlace(rank=pid, able=able, grows=grows):
            world.said(pid, able, grows)
        case Joining(rank=pid):
            return world.joined(pid, time.time())
        case Formed(rank=pid, generation=generation):
            world.gathered(pid, generation)
        case Reformed(generation=generation, size=size, commit=commit):
            return resized(world, generation, size, commit)
        case _:
            return message
    return None


class Ear(Protocol):
    """What the hands ask of the attempt's ear (`hora.job.hearing.Hearing`, a floor above)."""

    def forget_stall(self) -> None: ...


class Hands:
    """What carries an attempt's decisions out on its ranks (`hands(decision)`): the world's
    (`group`: the engine's, which starts new ranks), each at once, its record for the
    `callbacks`. The records are by process: nothing is renamed, the processes the world left
    are forgotten. A world changed forgets the stall its ranks reported (`hearing`)."""

    def __init__(
        self, records: Records, group: Any, hearing: Ear, callbacks: Sequence[Any] = ()
    ) -> None:
        self.records = records
        self.group = group
        self.hearing = hearing
        self.callbacks = tuple(callbacks)

    def __call__(self, decision: Any) -> None:
        if decision is None:
            return
        record = carry_out(self.records, self.group, decision)
        if not isinstance(decision, StartJoiners):
            self.hearing.forget_stall()
        for callback in self.callbacks if record is not None else ():
            callback.on_report(record)

    def tell_all(self, message: Any) -> None:
        """Send `message` to every rank whose channel is still open."""
        for conn in self.records.connections(open_only=True).values():
            _send(conn, message)


def carry_out(records: Records, group: Any, decision: Any) -> GrowingInPlace | None:
    """Do what the world decided (`group`: the engine's, which starts new ranks); the record
    of a growth started, for the callbacks. The records are by process: nothing is renamed,
    the processes the world left are forgotten."""
    match decision:
        case Abandon(why=why):
            records.forget_gone()
            say(f"giving up the growth in place ({why}); the running ranks go on")
        case ReformWorld():
            records.forget_gone()
            _reform(records, decision)
        case StartJoiners(joiners=joiners, running=running, generation=generation, why=why):
            before = len(running)
            env = {environment.GENERATION_VAR: str(generation)}
            group.add(list(joiners), list(running), env)
            added = ", ".join(str(rank) for _, rank in joiners)
            size = before + len(joiners)
            say(
                f"growing in place from {before} to {size} ranks ({why}): starting rank"
                f"{'s' * (len(joiners) > 1)} {added}; the running ranks keep their processes"
            )
            return GrowingInPlace(before, size, why)
    return None


def _reform(records: Records, order: ReformWorld) -> None:
    """Tell each process its place: the survivors of a loss re-form now; to grow, the running
    ones at their next commit (every Reform before any HostsUpdated)."""
    places = placement.placements(list(order.hosts))
    told = order.running if order.grow else order.members
    for rank, pid in enumerate(order.members):
        if pid not in told:
            continue
        record = records.of(pid)
        record.order = reform_order(places[rank], order.generation)  # for a late hello
        _send(record.connection, record.order)
    if order.grow:
        for pid in order.running:
            _send(records.of(pid).connection, HostsUpdated(order.generation))
        return
    size = len(order.members)
    change = f"from {order.before} to" if order.before != size else "at"
    why = order.why
    say(f"resizing in place {change} {size} ranks ({why}); the survivors keep their processes")


def _send(connection: Connection | None, message: Any) -> None:
    if connection is not None:
        with contextlib.suppress(OSError):
            connection.send(message)


def losses(records: Records) -> list[Loss]:
    """Each lost rank for the world: whether its process is gone, whether it failed with its
    job's own exception."""
    found = []
    for rank, record in records.ranked():
        failure = record.failure
        if not record.lost:
            continue
        if failure is None:  # only its channel closed: its process ended
            found.append(Loss(rank, gone=True))
        else:
            gone = record.exit is not None or failure.by_engine
            found.append(Loss(rank, gone=gone, own=failure.reported))
    return found


def why(records: Records) -> str:
    """The first failure, the other lost ranks, and the hosts none of whose ranks are left."""
    failures = records.failures()
    first = min(failures.values(), key=lambda f: f.time)
    ranked = list(records.ranked())
    gone = {rank for rank, record in ranked if record.lost}
    others = sorted(gone - {first.rank})
    also = f"; also lost: rank{'s' if len(others) > 1 else ''} " if others else ""
    also += ", ".join(map(str, others))
    left = {record.host for rank, record in ranked if rank not in gone}
    hosts = sorted({h for r, rec in ranked if r in gone and (h := rec.host) and h not in left})
    where = f"lost {', '.join(hosts)}: " if hosts else ""
    return f"{where}{first.headline()}{also}"


def resized(world: World, generation: int, size: int, commit: int) -> ResizedInPlace | None:
    """Rank 0 of the world of `generation` went on from `commit`: the record, and the line."""
    known = world.reformed(generation)
    if known is None:
        return None
    before, why, since = known
    now = time.time()
    seconds = now - since
    say(
        f"resized in place from {before} to {size} ranks in {seconds:.1f} s ({why}); the ranks "
        f"went on from commit {commit}"
    )
    if world.joined_at:  # a growth: what was the new ranks' own start, what the running ranks'
        say(
            f"growth from {before} to {size} ranks: the new ranks' start (process, imports, "
            f"init) {world.joined_at - since:.1f} s, then the running ranks' way to their next "
            f"commit and the sync {now - world.joined_at:.1f} s"
        )
    return ResizedInPlace(before, size, seconds, commit, why)


def reform_order(place: placement.RankPlacement, generation: int) -> Reform:
    """The driver's word to a rank: its place in the world re-formed as `generation`."""
    return Reform(place, generation)


def say(text: str) -> None:
    print(f"hora: {text}", file=sys.stderr, flush=True)
