"""The monitor's record of each rank's process, kept under the process's id for the attempt.

A process keeps its id (`hora.job.world`) when the world re-forms around it; its rank is what
the world says it is now (`World.rank_of`). So the records are never renumbered: a re-form
only forgets the processes that left, and every view by rank (the failure's story, the silence
check, the stacks) is made when it is asked for, from the world as it is then.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from hora.job.failures import Failure
from hora.job.world import World
from hora.wire.channel import Connection
from hora.wire.protocol import Reform

TAIL_LINES = 30  # the last lines of a rank's output kept for its failure's story


@dataclass
class RankRecord:
    """What the monitor knows of one rank's process."""

    host: str | None = None  # from its hello; None: it has not connected
    connection: Connection | None = None
    last_heard: float = 0.0  # time.monotonic() of its last message handled
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    returned: bool = False  # its result came (`result` may be None: not collected)
    result: bytes | None = None
    exit: int | None = None  # its process's exit code, once the launcher said
    closed: bool = False  # its channel closed, fully read
    stopped_at: int | None = None  # the commit it stopped at for the run to grow
    failure: Failure | None = None
    order: Reform | None = None  # its place in the latest world ordered, for a late hello

    @property
    def finished(self) -> bool:
        """Its part is over: it returned, exited, closed its channel or stopped to grow."""
        return self.returned or self.exit is not None or self.closed or self.stopped_at is not None

    @property
    def lost(self) -> bool:
        """It failed, or its channel closed without its last word (a result, a stop to grow):
        its process ended, though the engine may not have said why yet."""
        last_word = self.returned or self.stopped_at is not None
        return self.failure is not None or (self.closed and not last_word)


class Records:
    """Every process's record of one attempt, by process id; views by the rank now."""

    def __init__(self, world: World) -> None:
        self.world = world
        self._by_id: dict[int, RankRecord] = {}

    def of(self, pid: int) -> RankRecord:
        """The record of process `pid` (made at its first word, or the launcher's about it)."""
        record = self._by_id.get(pid)
        if record is None:
            record = self._by_id[pid] = RankRecord()
        return record

    def ranked(self) -> Iterator[tuple[int, RankRecord]]:
        """(rank now, record) of every process that has one, by rank."""
        return iter(sorted(self._with_ranks(), key=lambda pair: pair[0]))

    def _with_ranks(self) -> Iterator[tuple[int, RankRecord]]:
        """(rank now, record) of every process that has one, in no order (a count needs none:
        the monitor counts at every turn)."""
        rank_of = self.world.rank_of
        for pid, record in self._by_id.items():
            rank = rank_of(pid)
            if rank is not None:
                yield rank, record

    def forget_gone(self) -> None:
        """Forget the processes the world left behind, closing their channels (one that
        outlived what ran it hears the close, and ends itself)."""
        for pid in [pid for pid in self._by_id if self.world.rank_of(pid) is None]:
            connection = self._by_id.pop(pid).connection
            if connection is not None:
                with contextlib.suppress(OSError):
                    connection.close()

    # -- views by the rank now ------------------------------------------------------------
    def hosts(self) -> dict[int, str]:
        return {r: rec.host for r, rec in self.ranked() if rec.host is not None}

    def connections(self, open_only: bool = False) -> dict[int, Connection]:
        return {
            r: rec.connection
            for r, rec in self.ranked()
            if rec.connection is not None and not (open_only and rec.closed)
        }

    def results(self) -> dict[int, bytes | None]:
        return {r: rec.result for r, rec in self.ranked() if rec.returned}

    def failures(self) -> dict[int, Failure]:
        """Each failure, naming the rank its process is now."""
        return {
            r: dataclasses.replace(rec.failure, rank=r)
            for r, rec in self.ranked()
            if rec.failure is not None
        }

    def tails(self) -> dict[int, deque[str]]:
        return {r: rec.tail for r, rec in self.ranked()}

    def count(self, what: str) -> int:
        """How many ranks now have `what`: "started", "returned", "exited", "stopped"."""
        test = _COUNTED[what]
        return sum(1 for _, rec in self._with_ranks() if test(rec))

    def ranks_where(self, what: str) -> list[int]:
        test = _COUNTED[what]
        return [r for r, rec in self.ranked() if test(rec)]

    def fail(self, pid: int, failure: Failure, replace: bool = True) -> None:
        """Note `failure` on process `pid` (`replace` False: only if it has none yet)."""
        record = self.of(pid)
        if replace or record.failure is None:
            record.failure = failure

    def first_failure_time(self) -> float | None:
        times = [rec.failure.time for _, rec in self.ranked() if rec.failure is not None]
        return min(times) if times else None

    def heard(self, pid: int) -> None:
        self.of(pid).last_heard = time.monotonic()


_COUNTED = {
    "started": lambda rec: rec.host is not None,
    "returned": lambda rec: rec.returned,
    "exited": lambda rec: rec.exit is not None,
    "stopped": lambda rec: rec.stopped_at is not None,
    "failed": lambda rec: rec.failure is not None,
    "ended": lambda rec: rec.returned or rec.exit is not None or rec.failure is not None,
}
