"""Running one attempt: its group, the loop that hears its ranks, and a turn for its judge.

Everything the group reports arrives on one queue, handled on the caller's thread, so logs print
in order and nothing prints after the attempt is over. The monitor is the attempt's I/O and
decides nothing: its ear (`hora.job.hearing`) puts each message into one record per process
(`hora.job.records`), its judge (`hora.job.attempt`) turns the records into the attempt's state
and decisions at each turn, its hands (`hora.job.in_place.Hands`) carry them out on the ranks.
It returns how the attempt ended (`hora.job.outcome`) for the run's controller to judge.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Sequence
from typing import Protocol

from hora.engines import Capabilities
from hora.job.attempt import AttemptController
from hora.job.callbacks import MonitorCallback
from hora.job.elastic import Growth
from hora.job.hearing import Hearing
from hora.job.in_place import Hands
from hora.job.outcome import Ended, Limits, Outcome
from hora.job.records import Records
from hora.job.silence import silence_seconds
from hora.job.state import AttemptState
from hora.job.world import World
from hora.wire.protocol import (
    EngineFailed,
    Error,
    Exited,
    Metrics,
    Output,
    Resized,
    Result,
    Stall,
    TimelineBatch,
)

TICK_SECONDS = 0.05
BUSY_TURN = 16  # messages in a turn past which the loop takes the rest at the next turn
#: what may end a rank's part in the attempt: the loop turns at once after it
_ENDS_A_PART = (Result, Error, Exited, EngineFailed, Resized)


class Group(Protocol):
    """What the monitor needs of a worker group (a real `WorkerGroup`, or a test's fake)."""

    @property
    def events(self) -> queue.SimpleQueue | queue.Queue: ...

    @property
    def capabilities(self) -> Capabilities: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Monitor:
    """One attempt of a run: `run()` starts its group and returns how the attempt ended,
    `finish()` stops the group and drains what its ranks said last."""

    def __init__(
        self,
        group: Group,
        np: int,
        payload: bytes,
        collect_all: bool,
        callbacks: Sequence[MonitorCallback] = (),
        *,
        min_np: int,
        in_place: bool = False,
        known_commit: int = -1,
        growth: Growth | None = None,
    ):
        self.group = group
        # its ranks by process: re-formed in place (`in_place`) down to `min_np`, else restarted
        records = Records(World(np, min_np, in_place))
        can = group.capabilities
        self.hearing = Hearing(
            records, payload, collect_all, can.names_hosts, callbacks, known_commit
        )
        self.hands = Hands(records, group, self.hearing, callbacks)
        self.attempt = AttemptController(
            records, self.hearing, self.hands, can, callbacks, growth, silence_seconds()
        )

    @property
    def state(self) -> AttemptState:
        return self.attempt.state

    def run(self, limits: Limits) -> Outcome:
        """Start the group; every message handled as it comes (past BUSY_TURN in a turn, the
        rest at the next: one wake-up a turn for a thousand ranks' reports); a turn (a user's
        ask for the stacks, then the judge's) every TICK_SECONDS and after a message that may
        end a rank's part."""
        self.group.start()
        start_deadline = time.monotonic() + limits.start_timeout
        self.attempt.world.confirm_wait = limits.start_timeout
        next_turn, handled = 0.0, 0
        while True:
            now = time.monotonic()
            if now >= next_turn:
                self.hearing.serve_user_dump()
                outcome = self.attempt.turn(now, time.time(), limits, start_deadline)
                if outcome is not None:
                    return outcome
                next_turn, handled = now + TICK_SECONDS, 0
            try:
                busy = handled >= BUSY_TURN
                conn, message = self.group.events.get(not busy, max(0.0, next_turn - now))
            except queue.Empty:
                time.sleep(max(0.0, next_turn - now) if busy else 0.0)
                continue
            self.hands(self.hearing(conn, message))
            handled += 1
            if message is None or isinstance(message, _ENDS_A_PART):
                next_turn = 0.0

    def finish(self) -> Ended:
        """Stop the group (what comes now is drained, not judged), print what the ranks said
        before it stopped (nothing is lost at exit); the attempt's ranks and hosts as it ended."""
        self.hearing.stopping = True
        ended = self.attempt.stop()
        self.group.stop()
        while True:
            try:
                _conn, message = self.group.events.get_nowait()
            except queue.Empty:
                return ended
            if isinstance(message, Output | TimelineBatch | Stall | Metrics):
                self.hearing(None, message)
