"""An elastic attempt that grows in place: the running ranks keep their processes.

When the growth watch sees free slots and every running rank can re-form in place (`InPlace`),
the monitor does not ask the ranks to stop and restart: the engine starts the new ranks
(numbered after the running ones, which keep their ranks) where it has room, with the larger
world's coordinates (from their real hosts: the engine's choice) and its generation; each, once
it has its job and called `init()`, waits at that world's rendezvous and says so (`Joining`).
Then the running ranks are told their place in the larger world (`Reform`) and to re-form at
their next commit (`HostsUpdated(generation)`): there the new ranks take the running ones' state
by broadcast (`state.sync()`), and rank 0 says when training goes on (`Reformed`,
`hora.job.in_place`). Until every new rank waits, a failure
anywhere fails the attempt (the restart path resumes from the commit store).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from typing import Any, NamedTuple

from hora import environment
from hora.job.failures import Failure
from hora.job.in_place import Renumbering, Watched, reform_order, say
from hora.wire.protocol import HostsUpdated, InPlace, Joining


class GrowingInPlace(NamedTuple):
    """The driver's own record for its callbacks (the timeline): new ranks were started."""

    before: int
    size: int
    why: str


class Joiners:
    """The new ranks of one growth, from their start until each waits at the rendezvous."""

    def __init__(self, before: int, size: int, generation: int, deadline: float, why: str):
        self.before, self.size, self.generation = before, size, generation
        self.since = time.time()
        self.deadline = deadline  # time.monotonic() by which every new rank must wait
        self.why = why
        self.waiting = set(range(before, size))  # ranks (in the larger world) not there yet


class Growth:
    """The monitor's side of growing in place: which ids new ranks get, which are on their way."""

    def __init__(self, np: int, tail_lines: int) -> None:
        self.next_id = np  # ids name a rank's process to the driver; never one used before
        self.joiners: Joiners | None = None
        self.tail_lines = tail_lines  # how much of a new rank's output its story keeps
        self.start_timeout = 0.0  # the attempt's: how long new ranks have to reach the world
        self.no_growth: set[int] = set()  # processes (first ids) whose state cannot be grown

    def expects(self, rank: int) -> bool:
        """Whether `rank` (numbered now) is a new rank on its way."""
        return self.joiners is not None and rank in self.joiners.waiting

    def start(
        self,
        watched: Watched,
        renumbering: Renumbering,
        group: Any,
        size: int,
    ) -> GrowingInPlace | None:
        """Start ranks for a world of `size` when every running rank can re-form in place;
        None (nothing started) when they cannot."""
        before = watched.np
        if not self._possible(watched, renumbering, group, size):
            return None
        renumbering.generation += 1
        ids = {self.next_id + i: rank for i, rank in enumerate(range(before, size))}
        self.next_id += len(ids)
        renumbering.now.update(ids)
        why = f"free slots for {size} ranks"
        self.joiners = Joiners(
            before, size, renumbering.generation, time.monotonic() + self.start_timeout, why
        )
        for rank in ids.values():
            watched.tails[rank] = deque(maxlen=self.tail_lines)
        env = {environment.GENERATION_VAR: str(renumbering.generation)}
        # the engine places the new ranks: it knows their hosts, and the running ranks' by id
        group.add(list(ids.items()), [renumbering.first(r) for r in range(before)], env)
        added = ", ".join(str(r) for r in ids.values())
        say(
            f"growing in place from {before} to {size} ranks ({why}): starting rank"
            f"{'s' * (len(ids) > 1)} {added}; the running ranks keep their processes"
        )
        return GrowingInPlace(before, size, why)

    def ready(self, watched: Watched, renumbering: Renumbering) -> bool:
        """No resize in place is under way and, where the engine re-forms worlds, every rank
        has said whether it can (its hvd.elastic.run has started): only then is a growth
        judged, in place or by a restart, so the choice does not race the ranks' start."""
        if self.joiners is not None or renumbering.reforming is not None:
            return False
        said = renumbering.in_place | renumbering.cannot
        return renumbering.min_np is None or all(r in said for r in range(watched.np))

    def _possible(self, watched: Watched, renumbering: Renumbering, group: Any, size: int) -> bool:
        running = range(watched.np)
        return (
            not {renumbering.first(r) for r in running} & self.no_growth
            and size > watched.np
            and renumbering.min_np is not None
            and bool(getattr(group, "grows_in_place", False))
            and renumbering.reforming is None
            and not watched.failures
            and all(r in renumbering.in_place and r in watched.connections for r in running)
        )

    def report(self, watched: Watched, renumbering: Renumbering, message: Any) -> Any:
        """Take a new rank's word that it waits (None), note a rank whose state cannot grow in
        place (`InPlace.grows`), and hand any other `message` on as it is."""
        if isinstance(message, InPlace) and not message.grows:
            self.no_growth.add(renumbering.first(message.rank))
        if isinstance(message, Joining):
            self._joined(watched, renumbering, message.rank)
            return None
        return message

    def _joined(self, watched: Watched, renumbering: Renumbering, rank: int) -> None:
        """New rank `rank` waits at the rendezvous; once all do, the running ranks re-form."""
        joiners = self.joiners
        if joiners is None:
            return
        joiners.waiting.discard(rank)
        if joiners.waiting:
            return
        self.joiners = None
        watched.np = joiners.size
        renumbering.reforming = (joiners.since, joiners.before, joiners.why)
        # every rank's host as it said in its Hello, the new ones' too: where the engine put them
        places = environment.placements([watched.started[r] for r in range(joiners.size)])
        for rank in range(joiners.before):  # every Reform before any HostsUpdated
            with contextlib.suppress(OSError):
                watched.connections[rank].send(reform_order(places[rank], joiners.generation))
        for rank in range(joiners.before):
            with contextlib.suppress(OSError):
                watched.connections[rank].send(HostsUpdated(joiners.generation))

    def late(self, watched: Watched, now: float) -> None:
        """New ranks that did not reach the rendezvous in start_timeout fail the attempt."""
        joiners = self.joiners
        if joiners is None or now < joiners.deadline:
            return
        for rank in sorted(joiners.waiting):
            watched.failures.setdefault(
                rank,
                Failure(
                    rank,
                    "did not reach the larger world's rendezvous within start_timeout (it was "
                    f"started to grow the run in place from {joiners.before} to {joiners.size} "
                    "ranks)",
                    "",
                    False,
                    time.time(),
                ),
            )
