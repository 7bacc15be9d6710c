"""Carrying out the world's decisions (`hora.job.world`) on one attempt: the ranks' channels,
the engine, and the monitor's records of each rank.

Horovod's elastic mode resets its survivors in place; hora does the same for jobs in
`hvd.elastic.run` (torch, TensorFlow) on engines that keep a lost rank's survivors running
(`Launcher.reforms_in_place`). A world re-formed (`ReformWorld`) sends each rank its place
(`Reform`): after a loss the survivors, renumbered in rank order, re-form at once from the last
in-memory commit; to grow, the running ranks re-form at their next commit (`HostsUpdated`)
with new ranks that the engine started beforehand (`StartJoiners`, `Launcher.add`) and that
wait at that world's rendezvous (`Joining`). Rank 0 says when training goes on (`Reformed`).
Ranks name themselves by their process's id; the monitor keeps its records by the rank now.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple, Protocol

from hora import environment, placement
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


class Records(Protocol):
    """What of the monitor (`hora.job.monitor.Monitor`) a decision rewrites: its records of
    each rank, by the rank now."""

    np: int
    world: World
    group: Any
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
    orders: dict[int, Reform]  # process id -> its place in the latest world ordered


def translate(world: World, message: Any) -> Any:
    """`message` with the rank now of the process that sent it; None for one gone."""
    if not isinstance(message, FROM_A_RANK):
        return message
    rank = world.rank_of(message.rank)
    if rank is None or rank == message.rank:  # gone, or its id is its rank (no world re-formed)
        return None if rank is None else message
    return message._replace(rank=rank)


def hear(world: World, message: Any, decided: Callable[[Any], None]) -> Any:
    """The ranks' word on their world, to the world (its decisions to `decided`); the record
    for the callbacks of a `Reformed`; None for nothing more; any other `message` as is."""
    match message:
        case InPlace(rank=rank, able=able, grows=grows):
            world.said(world.id_of(rank), able, grows)
        case Joining(rank=rank):
            decided(world.joined(world.id_of(rank), time.time()))
        case Formed(rank=rank, generation=generation):
            world.gathered(world.id_of(rank), generation)
        case Reformed(generation=generation, size=size, commit=commit):
            return resized(world, generation, size, commit)
        case _:
            return message
    return None


def carry_out(records: Records, decision: Any, tail_lines: int) -> GrowingInPlace | None:
    """Do what the world decided; the record of a growth started, for the callbacks."""
    match decision:
        case Abandon(ranks=ranks, running=running, why=why):
            kept = {r: r for r in range(records.np + len(ranks)) if r not in ranks}
            _renumber(records, kept)
            records.np = running
            say(f"giving up the growth in place ({why}); the running ranks go on")
        case ReformWorld():
            _reform(records, decision)
        case StartJoiners(joiners=joiners, running=running, generation=generation, why=why):
            before = records.np
            for _, rank in joiners:
                records.tails[rank] = deque(maxlen=tail_lines)
            env = {environment.GENERATION_VAR: str(generation)}
            records.group.add(list(joiners), list(running), env)
            added = ", ".join(str(rank) for _, rank in joiners)
            size = before + len(joiners)
            say(
                f"growing in place from {before} to {size} ranks ({why}): starting rank"
                f"{'s' * (len(joiners) > 1)} {added}; the running ranks keep their processes"
            )
            return GrowingInPlace(before, size, why)
    return None


def _reform(records: Records, order: ReformWorld) -> None:
    """Renumber the records, then tell each rank its place: the survivors of a loss re-form
    now; to grow, the running ranks at their next commit (every Reform before any
    HostsUpdated)."""
    before = records.np
    _renumber(records, order.renumbered)
    records.np = len(order.members)
    places = placement.placements(list(order.hosts))
    told = order.running if order.grow else order.members
    for rank, pid in enumerate(order.members):
        if pid not in told:
            continue
        records.orders[pid] = reform_order(places[rank], order.generation)  # for a late hello
        if rank in records.connections:
            with contextlib.suppress(OSError):
                records.connections[rank].send(records.orders[pid])
    if order.grow:
        for rank in range(len(order.running)):
            with contextlib.suppress(OSError):
                records.connections[rank].send(HostsUpdated(order.generation))
        return
    change = f"from {before} to" if before != records.np else "at"
    say(
        f"resizing in place {change} {records.np} ranks ({order.why}); the survivors keep "
        "their processes"
    )


def _renumber(records: Records, kept: dict[int, int]) -> None:
    """Keep the records of the ranks in `kept` (old rank -> new rank); close the channels of
    the others (a rank that outlived what ran it hears the close, and ends itself)."""
    for rank, conn in records.connections.items():
        if rank not in kept:
            conn.close()

    def moved(values: dict[int, Any]) -> dict[int, Any]:
        return {kept[r]: v for r, v in values.items() if r in kept}

    records.started, records.connections = moved(records.started), moved(records.connections)
    records.last_heard, records.tails = moved(records.last_heard), moved(records.tails)
    records.results, records.exits = moved(records.results), moved(records.exits)
    records.resized = moved(records.resized)
    records.closed = {kept[r] for r in records.closed if r in kept}
    # a kept rank's failure not yet judged (it came while new ranks were told) stays, renamed
    failures = {kept[r]: replace(f, rank=kept[r]) for r, f in records.failures.items() if r in kept}
    records.failures, records.stall, records.stuck = failures, None, ()


def lost(records: Records) -> set[int]:
    """The failed ranks, and those whose channel closed without their last word (a result, a
    stop to grow): their process ended, though the engine may not have said why yet."""
    return set(records.failures) | (records.closed - set(records.results) - set(records.resized))


def losses(records: Records) -> list[Loss]:
    """Each lost rank for the world: whether its process is gone, whether it failed with its
    job's own exception."""
    found = []
    for rank in sorted(lost(records)):
        failure = records.failures.get(rank)
        if failure is None:  # only its channel closed: its process ended
            found.append(Loss(rank, gone=True))
        else:
            gone = rank in records.exits or failure.by_engine
            found.append(Loss(rank, gone=gone, own=failure.reported))
    return found


def why(records: Records) -> str:
    """The first failure, the other lost ranks, and the hosts none of whose ranks are left."""
    ordered = sorted(records.failures.values(), key=lambda f: f.time)
    gone = lost(records)
    others = sorted(gone - {ordered[0].rank})
    also = f"; also lost: rank{'s' if len(others) > 1 else ''} " if others else ""
    also += ", ".join(map(str, others))
    left = {records.started.get(r) for r in range(records.np) if r not in gone}
    hosts = sorted({h for r in gone if (h := records.started.get(r)) and h not in left})
    where = f"lost {', '.join(hosts)}: " if hosts else ""
    return f"{where}{ordered[0].headline()}{also}"


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
