"""A run's decisions between its attempts, in one place: what follows each attempt's end.

torchrun's restart loop and Ray Train v2's controller (`controller/controller.py`: a state, and
a decision for each event) for hora's driver. The controller holds what the run has spent and
learnt: its attempts, each failed attempt's story, the newest commit every rank made. It turns
each event (an attempt ended: `hora.job.outcome`; the cluster's count of free slots came or
never reached `min_np`) into one decision: finish, fail, size the next attempt from the
cluster, or start it. It does no I/O and reads no clock, so any sequence of events can be tried
(tests/job/test_controller.py); the driver (`hora.job.driver`) carries the decisions out: it
starts the attempts, asks the cluster, prints what the decision says and marks the timeline.

Within an attempt, whether a lost rank's survivors re-form in place is the world's
(`hora.job.world`); what stays a restart of every rank is in docs/elastic.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from hora.errors import HoraError, RunTimeoutError, WorkerFailedError
from hora.job.outcome import Failed, Finished, Outcome, StoppedToGrow, TimedOut
from hora.job.policy import FailurePolicy


@dataclass(frozen=True)
class Attempt:
    """The `index`-th (from 0) attempt of a run that allows `max_restarts` after the first, with
    `np` ranks."""

    index: int
    max_restarts: int
    np: int = 1

    def next(self, np: int) -> Attempt:
        return Attempt(self.index + 1, self.max_restarts, np)

    def __str__(self) -> str:
        return f"attempt {self.index + 1} of {self.max_restarts + 1}"


class RunPhase(enum.Enum):
    """Where a run is between its attempts; the last two end it."""

    RUNNING = "running"  # an attempt runs
    SIZING = "sizing"  # an elastic run waits for the cluster's count for its next attempt
    FINISHED = "finished"
    FAILED = "failed"


@dataclass(frozen=True)
class Mark:
    """What the driver says (stderr) and marks in the run's timeline as it carries a decision
    out; an empty `name`: nothing to mark."""

    say: str = ""
    name: str = ""
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StartAttempt:
    """Start `attempt` (a new group of `attempt.np` ranks)."""

    attempt: Attempt
    mark: Mark = Mark()


@dataclass(frozen=True)
class SizeNext:
    """Ask the cluster how many ranks the next attempt gets (`elastic.Sizer`): after a failure
    with the settle time (where the engine's count needs it), to grow wanting `want`."""

    settle: bool
    want: int | None = None
    mark: Mark = Mark()


@dataclass(frozen=True)
class Finish:
    """The run succeeded: the last attempt's pickled results by rank, of its `np` ranks."""

    results: dict[int, bytes | None]
    np: int


@dataclass(frozen=True)
class Fail:
    """The run ends with `error`, its cause kept (`from error.__cause__` where it has one)."""

    error: HoraError


Decision = StartAttempt | SizeNext | Finish | Fail


class RunController:
    """One run's decisions between its attempts."""

    def __init__(self, policy: FailurePolicy, np: int, elastic: bool, min_np: int = 1) -> None:
        self.policy = policy
        self.elastic = elastic
        self.min_np = min_np
        self.attempt = Attempt(0, policy.max_restarts, np)
        self.phase = RunPhase.RUNNING
        self.failed: list[WorkerFailedError] = []  # one story per failed attempt, in order
        self.known_commit = -1  # the newest commit every rank was seen to make (at a growth)
        self.hosts: dict[int, str] = {}  # the last attempt's rank -> host
        self._why = ""  # what the next attempt is sized for
        self._growing_from = -1  # the commit a growth by restart resumes from (-1: no growth)

    # -- events -------------------------------------------------------------------------------
    def ended(self, outcome: Outcome) -> Decision:
        """The attempt under way ended with `outcome`."""
        self.attempt = Attempt(self.attempt.index, self.attempt.max_restarts, outcome.np)
        self.hosts = outcome.hosts
        match outcome:
            case Finished(results=results):
                return self._end(RunPhase.FINISHED, Finish(results, outcome.np))
            case StoppedToGrow(commit=commit):
                self.known_commit = max(self.known_commit, commit)
                self._growing_from = commit
                self.phase = RunPhase.SIZING
                return SizeNext(settle=False, want=outcome.np + 1)
            case Failed(error=error):
                return self._failed(error)
            case TimedOut(error=timed_out):
                if self.failed:  # not restarted: the earlier failures are said with it
                    timed_out = _after_failures(timed_out, self.failed)
                return self._end(RunPhase.FAILED, Fail(timed_out))
        raise AssertionError(f"no decision for {outcome!r}")

    def sized(self, np: int) -> StartAttempt:
        """The cluster can run `np` ranks (at least `min_np`, at most `max_np`) for the next
        attempt."""
        before, self.phase = self.attempt.np, RunPhase.RUNNING
        self.attempt = self.attempt.next(np)
        if self._growing_from >= 0:
            commit, self._growing_from = self._growing_from, -1
            why = f"free slots for {np} ranks; every rank stopped at commit {commit}"
            say = f"hora: resizing from {before} to {np} ranks ({why})"
            args = {"from": before, "to": np, "why": why, "commit": commit}
            return StartAttempt(self.attempt, Mark(say, "resize", args))
        change = f"resizing from {before} to" if np != before else "restarting"
        say = f"hora: {change} {np} ranks ({self._why}); the ranks resume from their last commit"
        args = {"from": before, "to": np, "why": self._why}
        return StartAttempt(self.attempt, Mark(say, "resize", args))

    def too_few_slots(self, seen: int, waited: float) -> Fail:
        """The cluster stayed below `min_np` for the whole wait (`seen`: its last count)."""
        grew = self._growing_from >= 0
        why = "the slots it was to grow into left" if grew else self._why
        lines = [
            f"the cluster could run {seen} of min_np={self.min_np} ranks for {waited:.0f} s "
            f"after {self.attempt} of {self.attempt.np} ranks ended ({why}); the run stops. "
            "Give the cluster slots back, lower min_np, or raise start_timeout."
        ]
        for index, failure in enumerate(self.failed):
            lines += ["", f"failed attempt {index + 1}: {indented_story(failure)}"]
        first = self.failed[0] if self.failed else None
        error = WorkerFailedError(
            "\n".join(lines),
            first.rank if first else None,
            first.failed_ranks if first else (),
            attempts=tuple(self.failed),
        )
        return self._end(RunPhase.FAILED, Fail(error))

    # -- the decisions ------------------------------------------------------------------------
    def _failed(self, error: WorkerFailedError) -> Decision:
        """A failed attempt: the run fails once its restarts are spent; else the next attempt,
        of the same size, or (elastic) of the cluster's."""
        self.failed.append(error)
        if self.policy.decide(error, self.attempt.index + 1) == "fail":
            return self._end(RunPhase.FAILED, Fail(self._final_error()))
        story = f"hora: {self.attempt} failed: {indented_story(error)}"
        if self.elastic:
            self._why = self._lost(error)
            self.phase = RunPhase.SIZING
            return SizeNext(settle=True, mark=Mark(story))
        cause = {"failed": str(self.attempt), "cause": first_line(error)}
        self.attempt = self.attempt.next(self.attempt.np)
        say = f"{story}\nhora: restarting every rank (max_restarts={self.policy.max_restarts})"
        return StartAttempt(self.attempt, Mark(say, "restart", cause))

    def _end(self, phase: RunPhase, decision: Any) -> Any:
        self.phase = phase
        return decision

    def _lost(self, error: WorkerFailedError) -> str:
        """What was lost, for the resize line: the failed rank's host and the failure."""
        host = self.hosts.get(error.rank) if error.rank is not None else None
        return (f"lost {host}: " if host else "") + first_line(error)

    def _final_error(self) -> WorkerFailedError:
        if len(self.failed) == 1:
            return self.failed[0]  # no restart was allowed: the story as it always read
        first = self.failed[0]
        total = len(self.failed)
        lines = [
            f"every attempt failed ({total} of {total}, max_restarts={self.policy.max_restarts}); "
            "each attempt's root cause, first failure first:"
        ]
        for index, error in enumerate(self.failed):
            lines += ["", f"attempt {index + 1} of {total}: {indented_story(error)}"]
        return WorkerFailedError(
            "\n".join(lines), first.rank, first.failed_ranks, attempts=tuple(self.failed)
        )


def first_line(error: HoraError) -> str:
    return str(error).split("\n", 1)[0]


def indented_story(error: HoraError) -> str:
    first, _, rest = str(error).partition("\n")
    if not rest:
        return first
    return first + "\n" + "\n".join(f"    {line}" if line else "" for line in rest.split("\n"))


def _after_failures(error: RunTimeoutError, failed: list[WorkerFailedError]) -> RunTimeoutError:
    earlier = "; ".join(f"attempt {i + 1}: {first_line(e)}" for i, e in enumerate(failed))
    return RunTimeoutError(
        f"{error} Timeouts are not restarted. Earlier attempts failed: {earlier}", error.ranks
    )
