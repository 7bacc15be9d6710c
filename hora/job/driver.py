"""A run: attempts of a worker group, restarted by the failure policy until one succeeds.

torchrun's restart loop, for a whole group: when any rank fails, every rank is stopped, the
failure's story is printed, and a new group (new processes, or a new Spark barrier stage, with a
fresh rendezvous) runs the same job again. Nothing is kept in memory across attempts: the user's
checkpoints (`hora.checkpoint`) and hvd.elastic's commits (kept on each host) are what lets an
attempt resume where the last one stopped.

An elastic run (min_np/max_np) sizes each attempt to the cluster (`elastic.Sizer`) and, while
it runs below max_np, grows at a commit when slots return (`elastic.FreeSlots`). Every
attempt after the first, whether it follows a failure or a resize, spends one of max_restarts.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import cloudpickle

from hora import environment
from hora._output_files import OutputFiles
from hora.checkpoint import remove_host_commits
from hora.config import RunConfig
from hora.engines import AttemptSpec
from hora.errors import HoraError, RunTimeoutError, WorkerFailedError
from hora.job import callbacks
from hora.job.elastic import AttemptResized, FreeSlots, Sizer, TooFewSlots, settle_given
from hora.job.metrics import MetricsLog
from hora.job.monitor import Group, Limits, Monitor
from hora.job.policy import FailurePolicy
from hora.timeline import DriverTimeline


class StartableGroup(Group, Protocol):
    """A group the driver can start and stop: a `WorkerGroup` (one attempt's launcher and its
    channel), or a test's fake. What it says of its engine (`capabilities`) is its launcher's
    (`hora.engines.Launcher`, where each is declared with its default)."""

    def spare(self) -> int: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


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


#: builds the (not yet started) group of one attempt: the engine's launcher, given its spec
NewGroup = Callable[[AttemptSpec], StartableGroup]
#: the engine's count of the ranks it could run now: `(the run's spec, held) -> ranks`
EngineCapacity = Callable[[AttemptSpec, int], int]


class Job:
    """Runs a pickled job; `run()` returns the unpickled results by rank."""

    def __init__(
        self,
        config: RunConfig,
        payload: bytes | Callable[[], bytes],
        new_group: NewGroup,
        policy: FailurePolicy | None = None,
        capacity: EngineCapacity | None = None,
        commits_here: bool = False,
    ):
        self.config = config
        # the job pickled, or how to get it once the first group is built (the launcher says
        # whether the user's modules go by value)
        self.payload = payload
        self.new_group = new_group
        # RunConfig resolved max_restarts (None only before it did); from here on, the policy's
        self.policy = policy or FailurePolicy(config.max_restarts or 0)
        # What a launcher gets of the run; each attempt's spec is this one with its own np,
        # number, start wait and environment.
        self.spec = AttemptSpec(
            np=config.np,
            start_timeout=config.start_timeout,
            use_gpu=config.use_gpu,
            options=config.engine_options,
            max_np=config.most_ranks,
            ship_code=config.ship_code,
        )
        self.failed: list[WorkerFailedError] = []  # one story per failed attempt, in order
        # One for the run: a restarted attempt's reports follow the ones before it.
        self.metrics = MetricsLog(config.reporters(), progress=config.progress)
        self.run_id = uuid.uuid4().hex[:16]  # every attempt's: where the ranks keep commits
        self.commits_here = commits_here  # every rank runs on this host: remove them at the end
        self.sizer: Sizer | None = None
        if config.elastic:
            if capacity is None:
                raise ValueError("an elastic run needs its engine's capacity")
            spec = self.spec
            self.sizer = Sizer(config.min_np or 1, config.most_ranks, lambda h: capacity(spec, h))
        self._hosts: dict[int, str] = {}  # the last attempt's rank -> host
        self._known_commit = -1  # the newest commit every rank was seen to make (at a growth)
        self._first: StartableGroup | None = None  # built before anything else of the run
        self._np_now = config.np  # the last attempt's ranks when it ended
        self._settles = True  # whether the engine's count of free slots needs the settle time

    def run(self) -> list[Any]:
        config = self.config
        deadline = time.monotonic() + config.timeout if config.timeout else None
        self.output_files = None
        timeline = None
        try:
            attempt = Attempt(0, self.policy.max_restarts, config.np)
            # The engine checks its cluster (slots, Python) first, before anything is written.
            self._first = self.new_group(self._spec(attempt, deadline))
            # Before anything starts (a bad folder is a ValueError); one for the run: an
            # attempt's output follows the one before it.
            self.output_files = (
                OutputFiles(config.output_filename, config.most_ranks)
                if config.output_filename
                else None
            )
            timeline = DriverTimeline()  # one for the run: restarts are marks in the same trace
            while True:
                try:
                    results = self._attempt_explained(attempt, timeline, deadline)
                except WorkerFailedError as error:
                    attempt = dataclasses.replace(attempt, np=self._np_now)
                    self.failed.append(error)
                    if self.policy.decide(error, attempt.index + 1) == "fail":
                        final = self._final_error()
                        raise final from final.__cause__  # the rank's traceback, or none
                    _say(f"hora: {attempt} failed: {_indented_story(error)}")
                    attempt = self._after_failure(attempt, error, timeline, deadline)
                    continue
                except AttemptResized as resized:
                    attempt = dataclasses.replace(attempt, np=self._np_now)
                    attempt = self._grow(attempt, resized.commit, timeline, deadline)
                    continue
                except RunTimeoutError as error:
                    if self.failed:
                        raise _after_failures(error, self.failed) from None
                    raise
                return [_loads(results.get(r)) for r in range(self._np_now)]
        finally:
            if timeline is not None:
                timeline.close()
            self.metrics.close()
            if self.output_files is not None:
                self.output_files.close()
            if self.commits_here:
                remove_host_commits(self.run_id)

    # -- what follows an attempt ------------------------------------------------------------
    def _after_failure(
        self,
        attempt: Attempt,
        error: WorkerFailedError,
        timeline: DriverTimeline,
        deadline: float | None,
    ) -> Attempt:
        """The next attempt after a failure: the same size, or (elastic) the cluster's."""
        config = self.config
        if self.sizer is None:
            _say(f"hora: restarting every rank (max_restarts={self.policy.max_restarts})")
            timeline.mark("restart", {"failed": str(attempt), "cause": _first_line(error)})
            return attempt.next(attempt.np)
        why = self._lost(error)
        try:
            np = self.sizer.next_size(_wait(config.start_timeout, deadline), self._settles)
        except TooFewSlots as short:
            raise self._too_few_slots(attempt, short, why) from None
        change = f"resizing from {attempt.np} to" if np != attempt.np else "restarting"
        _say(f"hora: {change} {np} ranks ({why}); the ranks resume from their last commit")
        timeline.mark("resize", {"from": attempt.np, "to": np, "why": why})
        return attempt.next(np)

    def _grow(
        self, attempt: Attempt, commit: int, timeline: DriverTimeline, deadline: float | None
    ) -> Attempt:
        """Every rank stopped at `commit` for the run to grow: the next, larger attempt."""
        assert self.sizer is not None  # only an elastic run's ranks stop to grow
        try:
            wait = _wait(self.config.start_timeout, deadline)
            np = self.sizer.next_size(wait, settle=False, want=attempt.np + 1)
            self._known_commit = max(self._known_commit, commit)
        except TooFewSlots as short:
            raise self._too_few_slots(
                attempt, short, "the slots it was to grow into left"
            ) from None
        why = f"free slots for {np} ranks; every rank stopped at commit {commit}"
        _say(f"hora: resizing from {attempt.np} to {np} ranks ({why})")
        timeline.mark("resize", {"from": attempt.np, "to": np, "why": why, "commit": commit})
        return attempt.next(np)

    def _lost(self, error: WorkerFailedError) -> str:
        """What was lost, for the resize line: the failed rank's host and the failure."""
        host = self._hosts.get(error.rank) if error.rank is not None else None
        return (f"lost {host}: " if host else "") + _first_line(error)

    def _too_few_slots(self, attempt: Attempt, short: TooFewSlots, why: str) -> WorkerFailedError:
        min_np = self.config.min_np
        lines = [
            f"the cluster could run {short.seen} of min_np={min_np} ranks for {short.waited:.0f} s "
            f"after {attempt} of {attempt.np} ranks ended ({why}); the run stops. Give the "
            "cluster slots back, lower min_np, or raise start_timeout."
        ]
        for index, failure in enumerate(self.failed):
            lines += ["", f"failed attempt {index + 1}: {_indented_story(failure)}"]
        first = self.failed[0] if self.failed else None
        return WorkerFailedError(
            "\n".join(lines),
            first.rank if first else None,
            first.failed_ranks if first else (),
            attempts=tuple(self.failed),
        )

    def _attempt_explained(
        self, attempt: Attempt, timeline: DriverTimeline, deadline: float | None
    ) -> dict[int, bytes | None]:
        """`_attempt`, where a restart the engine refuses (its slots are gone with a host) says
        what the restart was for, in the error's own class."""
        try:
            return self._attempt(attempt, timeline, deadline)
        except (ValueError, RuntimeError) as error:
            if self.failed and type(error) in (ValueError, RuntimeError):
                raise type(error)(_with_earlier(str(error), self.failed)) from error
            raise

    def _attempt(
        self, attempt: Attempt, timeline: DriverTimeline, deadline: float | None
    ) -> dict[int, bytes | None]:
        config = self.config
        if attempt.index:
            _say(f"hora: {attempt} starting" + (f" ({attempt.np} ranks)" if config.elastic else ""))
        group, self._first = self._first or self.new_group(self._spec(attempt, deadline)), None
        can = group.capabilities
        self._settles = settle_given() or not can.exact_count
        in_place = (config.min_np or 1) if config.elastic and can.reforms_in_place else None
        watchers = callbacks.for_attempt(
            attempt.index,
            timeline,
            self.metrics,
            self.output_files,
            self._growth(
                attempt, in_place is not None and can.grows_in_place, group, in_place is not None
            ),
            log_callback_only=config.driver_log_verbosity == "log_callback_only",
        )
        payload = self.payload if isinstance(self.payload, bytes) else self.payload()
        monitor = Monitor(
            group,
            attempt.np,
            payload,
            config.collect_all,
            watchers,
            in_place_min_np=in_place,
            known_commit=self._known_commit,
        )
        try:
            group.start()
            return monitor.watch(Limits(config.start_timeout, config.timeout, deadline))
        finally:
            monitor.stopping = True
            group.stop()
            monitor.drain()
            self._hosts = dict(monitor.started) if can.names_hosts else {}
            self._np_now = monitor.np  # fewer after a shrink in place

    def _spec(self, attempt: Attempt, deadline: float | None) -> AttemptSpec:
        """What the launcher of `attempt` gets: its ranks, its wait for slots (never past the
        run's deadline), and the ranks' environment."""
        config = self.config
        env = (
            environment.driver_env()
            | dict(config.env)
            | environment.restart_env(attempt.index, attempt.max_restarts)
            | environment.run_env(self.run_id, config.elastic)
        )
        return dataclasses.replace(
            self.spec,
            np=attempt.np,
            attempt=attempt.index,
            start_timeout=_wait(config.start_timeout, deadline),
            env=env,
        )

    def _growth(
        self,
        attempt: Attempt,
        in_place: bool = False,
        group: StartableGroup | None = None,
        shrinks: bool = False,
    ) -> callbacks.Grow | None:
        """A watch for returning slots: while the attempt runs below max_np, to grow by a
        restart (while the budget has an attempt left) or, `in_place` (its engine re-forms
        worlds and starts ranks into them), in place (spending none; also after it shrank in
        place). It counts what `group` holds beyond its ranks too (`Launcher.spare`).
        `shrinks`: its ranks may re-form a smaller world in place, below max_np."""
        sizer = self.sizer
        if sizer is None:
            return None
        # by a restart while the budget has an attempt left, for an attempt that started below
        # max_np, or one that may shrink in place (growing back by a restart where not in place)
        below = attempt.np < sizer.max_np or shrinks
        restart = below and attempt.index < self.policy.max_restarts
        if not (in_place or restart):
            return None  # the run finishes at this size
        count = sizer.capacity
        steady = sizer.settle if self._settles else 0.0
        watch = FreeSlots(attempt.np, lambda held: count(held + _spare(group)), steady)
        return callbacks.Grow(watch, sizer.max_np, restart)

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
            lines += ["", f"attempt {index + 1} of {total}: {_indented_story(error)}"]
        return WorkerFailedError(
            "\n".join(lines), first.rank, first.failed_ranks, attempts=tuple(self.failed)
        )


def _spare(group: StartableGroup | None) -> int:
    """Ranks the group's attempt could add in what it holds already (`Launcher.spare`)."""
    return group.spare() if group is not None else 0


def _wait(start_timeout: float, deadline: float | None) -> float:
    """How long to wait for slots: start_timeout, or less when the run's timeout comes first."""
    if deadline is None:
        return start_timeout
    return max(0.0, min(start_timeout, deadline - time.monotonic()))


def _loads(data: bytes | None) -> Any:
    return None if data is None else cloudpickle.loads(data)


def _say(text: str) -> None:
    sys.stdout.flush()
    print(text, file=sys.stderr, flush=True)


def _first_line(error: HoraError) -> str:
    return str(error).split("\n", 1)[0]


def _indented_story(error: HoraError) -> str:
    first, _, rest = str(error).partition("\n")
    if not rest:
        return first
    return first + "\n" + "\n".join(f"    {line}" if line else "" for line in rest.split("\n"))


def _with_earlier(text: str, failed: list[WorkerFailedError]) -> str:
    earlier = "\n".join(f"attempt {i + 1}: {_indented_story(e)}" for i, e in enumerate(failed))
    return f"{text}\n\nThe restart was for what failed before:\n{earlier}"


def _after_failures(error: RunTimeoutError, failed: list[WorkerFailedError]) -> RunTimeoutError:
    earlier = "; ".join(f"attempt {i + 1}: {_first_line(e)}" for i, e in enumerate(failed))
    return RunTimeoutError(
        f"{error} Timeouts are not restarted. Earlier attempts failed: {earlier}", error.ranks
    )
