"""Watching one attempt: hand out the job, relay logs, collect results, tell a failure's story.

Everything the group reports arrives on one queue, handled on the caller's thread, so logs print
in order and nothing prints after the attempt is over. The monitor decides nothing about
restarts: it returns how the attempt ended (`hora.job.outcome`) for the driver to judge. It
keeps one record per process (`hora.job.records`), whose rank the world says (`hora.job.world`),
and goes through explicit states (`AttemptState`); the console, output files, timeline, metrics
and growth watch are callbacks (`hora.job.callbacks`) told of each change, line, report and turn.
"""

from __future__ import annotations

import contextlib
import queue
import sys
import time
from collections.abc import Sequence
from typing import Any, Protocol

from hora.engines import Capabilities
from hora.job import in_place
from hora.job.callbacks import AttemptState, MonitorCallback
from hora.job.failures import Failure, not_started, past_timeout, story
from hora.job.hearing import Hearing
from hora.job.outcome import Ended, Failed, Finished, Limits, Outcome, StoppedToGrow, TimedOut
from hora.job.records import Records
from hora.job.silence import silence_seconds, silent
from hora.job.world import Phase, Restart, World
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

SETTLE_SECONDS = 0.3  # after a first failure, wait this long for its cause to be reported too
EXIT_GRACE_SECONDS = 10.0  # after every result is in, how long ranks get to exit by themselves
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
    ):
        self.group = group
        self.callbacks = tuple(callbacks)
        #: its ranks by process: re-formed in place (`in_place`) down to `min_np`, else restarted
        self.world = World(np, min_np, in_place)
        self.records = Records(self.world)
        names_hosts = group.capabilities.names_hosts
        self.hearing = Hearing(
            self.records, payload, collect_all, names_hosts, callbacks, self._decided, known_commit
        )
        self.questions = self.hearing.questions
        self.silence_s = silence_seconds()
        self._silence_due = 0.0  # no rank can be silent before it (`silence.silent`)
        self.start_timeout = 0.0  # the attempt's: how long new ranks have to reach the world
        self._all_done_at: float | None = None
        self.state = AttemptState.STARTING
        for callback in self.callbacks:
            callback.on_state(self, None, self.state)

    @property
    def np(self) -> int:
        """The attempt's ranks now (fewer after a shrink in place, more once a growth formed)."""
        return self.world.size

    # -- its state --------------------------------------------------------------------------
    def _enter(self, state: AttemptState) -> None:
        previous, self.state = self.state, state
        if state is not previous:
            for callback in self.callbacks:
                callback.on_state(self, previous, state)

    def _judged(self) -> AttemptState:
        """The state the ranks' reports so far put a running attempt in."""
        count = self.records.count
        if count("failed"):
            return AttemptState.FAILING
        if count("returned") >= self.np:
            return AttemptState.FINISHING
        if count("started") >= self.np:  # more: new ranks on their way to grow it in place
            return AttemptState.RUNNING
        return AttemptState.STARTING

    # -- the loop ---------------------------------------------------------------------------
    def run(self, limits: Limits) -> Outcome:
        """Start the group; every message handled as it comes (past BUSY_TURN in a turn, the
        rest at the next: one wake-up a turn for a thousand ranks' reports); a turn (silence,
        state, ticks, the end, limits) every TICK_SECONDS and after a message that may end a
        rank's part."""
        self.group.start()
        start_deadline = time.monotonic() + limits.start_timeout
        self.start_timeout = self.world.confirm_wait = limits.start_timeout
        next_turn, handled = 0.0, 0
        while True:
            now = time.monotonic()
            if now >= next_turn:
                outcome = self._turn(now, limits, start_deadline)
                if outcome is not None:
                    return outcome
                next_turn, handled = now + TICK_SECONDS, 0
            try:
                busy = handled >= BUSY_TURN
                conn, message = self.group.events.get(not busy, max(0.0, next_turn - now))
            except queue.Empty:
                time.sleep(max(0.0, next_turn - now) if busy else 0.0)
                continue
            self.hearing(conn, message)
            handled += 1
            if message is None or isinstance(message, _ENDS_A_PART):
                next_turn = 0.0

    def _turn(self, now: float, limits: Limits, start_deadline: float) -> Outcome | None:
        """One turn of the loop; how the attempt ended, once it did."""
        self.hearing.serve_user_dump()
        self._note_silent_ranks(now)
        self._enter(self._judged())
        for callback in self.callbacks:
            callback.on_tick(self, now)
        return self._ended(now) or self._past_limits(limits, start_deadline, now)

    def _ended(self, now: float) -> Outcome | None:
        """Every rank returned (and exited, or had its grace to); a failure's story once the
        settle time and any question to the ranks are over; every rank stopped at a commit to
        grow. None while the attempt goes on."""
        late = self.world.late(now, time.time())
        if isinstance(late, Restart):  # a failure of the attempt, told as any other
            failure = Failure(0, late.why, "", False, time.time())
            self.records.fail(self.world.id_of(0), failure, replace=False)
        else:
            self._decided(late)
        first = self.records.first_failure_time()
        if first is not None:
            return self._failed(now, first)
        if self.records.count("stopped") == self.np:
            commit = max(rec.stopped_at or 0 for _, rec in self.records.ranked())
            return self._end(AttemptState.RESIZED, StoppedToGrow, commit=commit)
        if self.records.count("returned") < self.np:
            return None
        self._all_done_at = self._all_done_at or now
        if self.records.count("exited") == self.np or now - self._all_done_at > EXIT_GRACE_SECONDS:
            return self._end(AttemptState.SUCCEEDED, Finished, results=self.records.results())
        return None

    def _failed(self, now: float, first: float) -> Outcome | None:
        """A rank failed (the first at `first`): once the settle time is over, the world goes
        on without the lost ranks where it can; else the story, once the ranks answered."""
        if time.time() - first < SETTLE_SECONDS:
            return None
        if self._may_go_on():
            losses, why = in_place.losses(self.records), in_place.why(self.records)
            for decision in self.world.lose(losses, first, why):
                if not isinstance(decision, Restart):
                    self._decided(decision)
            if not self.records.count("failed"):
                return None
        if self.questions.answered(now):
            return self._end(AttemptState.FAILED, Failed, error=self.failure_error())
        return None

    def _end(self, state: AttemptState, outcome: type[Ended], **what: Any) -> Any:
        self._enter(state)
        return outcome(np=self.np, hosts=self._hosts(), **what)

    def _hosts(self) -> dict[int, str]:
        return self.records.hosts() if self.group.capabilities.names_hosts else {}

    def _past_limits(self, limits: Limits, start_deadline: float, now: float) -> Outcome | None:
        """Ranks that did not all start in time, or the run's timeout passed (once the ranks
        were asked where they are)."""
        if self.records.count("started") < self.np and now > start_deadline:
            started = self.records.ranks_where("started")
            missing = [r for r in range(self.np) if r not in started]
            error = not_started(missing, self.np, limits.start_timeout)
            return self._end(AttemptState.TIMED_OUT, TimedOut, error=error)
        if limits.deadline is not None and now > limits.deadline:
            self.hearing.ask_where(f"the run reached timeout={limits.timeout:g} s")
            if self.questions.answered(now):
                returned = set(self.records.ranks_where("returned"))
                running = [r for r in range(self.np) if r not in returned]  # silent ones too
                dump = self.questions.dump
                where = self.hearing.stack_report(dump) if dump is not None else None
                error = past_timeout(running, limits.timeout, self.hearing.stall, where)
                return self._end(AttemptState.TIMED_OUT, TimedOut, error=error)
        return None

    # -- in place (`hora.job.world` decides, `hora.job.in_place` carries out) ---------------
    def _may_go_on(self) -> bool:
        """The world may be asked to go on without the lost ranks: an attempt that may re-form,
        not stopped or asked where it is, and no survivor done already."""
        if not self.world.in_place or self.world.phase is Phase.RESTARTING:
            return False
        ranked = self.records.ranked()
        survivors = [rec for r, rec in ranked if r < self.np and not rec.lost]  # no new rank
        done = any(rec.finished for rec in survivors)
        return self.state is not AttemptState.STOPPING and self.questions.dump is None and not done

    def _decided(self, decision: Any) -> None:
        if decision is None:
            return
        record = in_place.carry_out(self.records, self.group, decision)
        if not isinstance(decision, in_place.StartJoiners):
            self.hearing.stall, self.hearing.stuck = None, ()  # the world that stalled is gone
        for callback in self.callbacks if record is not None else ():
            callback.on_report(record)

    @property
    def may_grow(self) -> bool:
        """Whether the growth watch may judge now: every rank's hvd.elastic.run has said
        whether it can re-form, and no change of the world is under way."""
        return not self.world.in_place or self.world.phase is Phase.RUNNING

    def grow_in_place(self, size: int) -> bool:
        """Start new ranks for a world of `size` that the running ranks re-form into at their
        next commit; False when they cannot (the run may grow by a restart instead)."""
        if self.records.count("failed"):
            return False
        can_add = self.group.capabilities.grows_in_place
        start = self.world.grow(size, can_add, time.monotonic(), self.start_timeout, time.time())
        self._decided(start)
        return start is not None

    def _note_silent_ranks(self, now: float) -> None:
        """A running rank not heard from for the silence time fails the attempt, naming its
        host: a cut-off host's ranks would otherwise wait in their collectives for ever.
        Looked at (every rank) only once one could be silent: its last word's time + silence."""
        if now < self._silence_due:
            return
        found, self._silence_due = silent(self.records.ranked(), now, self.silence_s)
        for rank, failure in found.items():
            self.records.fail(self.world.id_of(rank), failure)  # said now: a stop takes seconds
            print(f"hora: {failure.headline()}; stopping the attempt", file=sys.stderr, flush=True)

    def send_all(self, message: Any) -> None:
        """Send `message` to every rank whose channel is still open."""
        for conn in self.records.connections(open_only=True).values():
            with contextlib.suppress(OSError):
                conn.send(message)

    # -- where each rank is -----------------------------------------------------------------
    def finish(self) -> Ended:
        """Stop the group (what comes now is drained, not judged), print what the ranks said
        before it stopped (nothing is lost at exit); the attempt's ranks and hosts as it ended."""
        self.world.stop()
        self.hearing.stopping = True
        self._enter(AttemptState.STOPPING)
        self.group.stop()
        while True:
            try:
                _conn, message = self.group.events.get_nowait()
            except queue.Empty:
                return Ended(np=self.np, hosts=self._hosts())
            if isinstance(message, Output | TimelineBatch | Stall | Metrics):
                self.hearing(None, message)

    def failure_error(self) -> Any:
        dump = self.questions.dump
        report = self.hearing.stack_report(dump) if dump is not None else None
        return story(self.records.failures(), self.records.tails(), report)
