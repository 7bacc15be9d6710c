"""One attempt's decisions, in one place: how it stands, whether it grows, how it ended.

The run's controller (`hora.job.controller`) decides between attempts; this one decides within
one, after Ray Train v2's controller (a state, and a decision for each turn) and torch elastic's
`WorkerState`. At each turn of its monitor's loop it reads what the ranks said (the records, by
process: `hora.job.records`) and the world's membership (`hora.job.world`, which decides how the
world changes in place), and turns them into one state (`AttemptState`) and what follows: a lost
rank's world re-formed or the attempt failed, free slots taken in place or by a restart, ranks
asked where they are, an end (`hora.job.outcome`). Its hands (`hora.job.in_place.Hands`) carry
each decision out on the ranks at once, so the next check sees it done; it reads no clock (its
monitor gives it the time) and receives no message (its monitor's ear does: `hora.job.hearing`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from hora.engines import Capabilities
from hora.job import in_place
from hora.job.callbacks import MonitorCallback
from hora.job.elastic import Growth
from hora.job.failures import Failure, not_started, past_timeout, story
from hora.job.hearing import Hearing
from hora.job.outcome import Ended, Failed, Finished, Limits, Outcome, StoppedToGrow, TimedOut
from hora.job.records import Records
from hora.job.silence import silent
from hora.job.state import AttemptState
from hora.job.world import Restart
from hora.wire.protocol import HostsUpdated

SETTLE_SECONDS = 0.3  # after a first failure, wait this long for its cause to be reported too
EXIT_GRACE_SECONDS = 10.0  # after every result is in, how long ranks get to exit by themselves
#: the world's states a running attempt shows: its world changes in place
_CHANGING = (AttemptState.SHRINKING, AttemptState.GROWING)


class AttemptController:
    """The judge of one attempt: `turn()` at each turn of the loop, None until it ended."""

    def __init__(
        self,
        records: Records,
        hearing: Hearing,
        hands: in_place.Hands,
        capabilities: Capabilities,
        callbacks: Sequence[MonitorCallback] = (),
        growth: Growth | None = None,
        silence_s: float = float("inf"),
    ) -> None:
        self.records = records
        self.world = records.world
        self.hearing = hearing
        self.questions = hearing.questions
        self.hands = hands
        self.capabilities = capabilities
        self.callbacks = tuple(callbacks)
        self.growth = growth
        self.silence_s = silence_s
        self._silence_due = 0.0  # no rank can be silent before it (`silence.silent`)
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
        """The state the ranks' reports so far, and its world, put a running attempt in."""
        count = self.records.count
        if count("failed"):
            return AttemptState.FAILING
        if count("returned") >= self.np:
            return AttemptState.FINISHING
        if count("started") < self.np:  # more: new ranks on their way to grow it in place
            return AttemptState.STARTING
        if self.world.phase in _CHANGING:
            return self.world.phase
        return AttemptState.RUNNING

    # -- a turn -----------------------------------------------------------------------------
    def turn(
        self, now: float, wall: float, limits: Limits, start_deadline: float
    ) -> Outcome | None:
        """One turn (`now`: the monitor's `time.monotonic()`, `wall`: its `time.time()`): the
        silent ranks, the state, the growth watch, then how the attempt ended, once it did."""
        self._note_silent_ranks(now)
        self._enter(self._judged())
        for callback in self.callbacks:
            callback.on_tick(self, now)
        self._watch_growth(now, wall)
        return self._ended(now, wall) or self._past_limits(limits, start_deadline, now)

    def stop(self) -> Ended:
        """The group is being stopped: nothing more is decided."""
        self.world.stop()
        self._enter(AttemptState.STOPPING)
        return Ended(np=self.np, hosts=self._hosts())

    def _ended(self, now: float, wall: float) -> Outcome | None:
        """Every rank returned (and exited, or had its grace to); a failure's story once the
        settle time and any question to the ranks are over; every rank stopped at a commit to
        grow. None while the attempt goes on."""
        late = self.world.late(now, wall)
        if isinstance(late, Restart):  # a failure of the attempt, told as any other
            failure = Failure(0, late.why, "", False, wall)
            self.records.fail(self.world.id_of(0), failure, replace=False)
        else:
            self.hands(late)
        first = self.records.first_failure_time()
        if first is not None:
            return self._failed(now, wall, first)
        if self.records.count("stopped") == self.np:
            commit = max(rec.stopped_at or 0 for _, rec in self.records.ranked())
            return self._end(AttemptState.RESIZED, StoppedToGrow, commit=commit)
        if self.records.count("returned") < self.np:
            return None
        self._all_done_at = self._all_done_at or now
        if self.records.count("exited") == self.np or now - self._all_done_at > EXIT_GRACE_SECONDS:
            return self._end(AttemptState.SUCCEEDED, Finished, results=self.records.results())
        return None

    def _failed(self, now: float, wall: float, first: float) -> Outcome | None:
        """A rank failed (the first at `first`): once the settle time is over, the world goes
        on without the lost ranks where it can; else the story, once the ranks answered."""
        if wall - first < SETTLE_SECONDS:
            return None
        if self._may_go_on():
            losses, why = in_place.losses(self.records), in_place.why(self.records)
            for decision in self.world.lose(losses, first, why):
                if not isinstance(decision, Restart):
                    self.hands(decision)
            if not self.records.count("failed"):
                return None
        if self.questions.answered(now):
            return self._end(AttemptState.FAILED, Failed, error=self.failure_error())
        return None

    def _end(self, state: AttemptState, outcome: type[Ended], **what: Any) -> Any:
        self._enter(state)
        return outcome(np=self.np, hosts=self._hosts(), **what)

    def _hosts(self) -> dict[int, str]:
        return self.records.hosts() if self.capabilities.names_hosts else {}

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

    def failure_error(self) -> Any:
        dump = self.questions.dump
        report = self.hearing.stack_report(dump) if dump is not None else None
        return story(self.records.failures(), self.records.tails(), report)

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

    # -- in place (`hora.job.world` decides its membership) ---------------------------------
    def _may_go_on(self) -> bool:
        """The world may be asked to go on without the lost ranks: an attempt that may re-form,
        not stopped or asked where it is, and no survivor done already."""
        if not self.world.in_place or self.world.phase is AttemptState.FAILING:
            return False
        ranked = self.records.ranked()
        survivors = [rec for r, rec in ranked if r < self.np and not rec.lost]  # no new rank
        done = any(rec.finished for rec in survivors)
        return self.state is not AttemptState.STOPPING and self.questions.dump is None and not done

    def _watch_growth(self, now: float, wall: float) -> None:
        """An elastic attempt that may grow: while every rank runs, once the cluster has had
        room for more for the settle time, grow in place where the ranks can, else (with a
        restart left) ask them all to stop at their next commit. After a resize in place, or a
        growth in place given up (a new rank was lost), it watches again."""
        growth = self.growth
        if growth is None or self.state is not AttemptState.RUNNING or not self._world_still:
            return
        watch = growth.watch
        if self.np != watch.np or growth.in_place:  # resized, or the growth given up
            growth.watch = watch = watch.anew(self.np)
            growth.in_place = False
        if self.np >= growth.max_np or not watch.due(now):
            return
        growth.in_place = self._grow_in_place(min(growth.max_np, watch.seen), now, wall)
        if not growth.in_place and growth.restart:
            self.hands.tell_all(HostsUpdated())

    @property
    def _world_still(self) -> bool:
        """Every rank's hvd.elastic.run has said whether it can re-form, and no change of the
        world is under way."""
        return not self.world.in_place or self.world.phase is AttemptState.RUNNING

    def _grow_in_place(self, size: int, now: float, wall: float) -> bool:
        """Start new ranks for a world of `size` that the running ranks re-form into at their
        next commit; False when they cannot (the run may grow by a restart instead)."""
        if self.records.count("failed"):
            return False
        can_add = self.capabilities.grows_in_place
        start = self.world.grow(size, can_add, now, self.world.confirm_wait, wall)
        self.hands(start)
        return start is not None
