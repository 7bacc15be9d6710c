"""A run: attempts of a worker group, restarted by the failure policy until one succeeds.

torchrun's restart loop, for a whole group: when any rank fails, every rank is stopped, the
failure's story is printed, and a new group (new processes, or a new Spark barrier stage, with a
fresh rendezvous) runs the same job again. Nothing is kept in memory across attempts: the user's
checkpoints (`hora.checkpoint`) and hvd.elastic's commits (kept on each host) are what lets an
attempt resume where the last one stopped.

What follows each attempt is the run controller's decision (`hora.job.controller`); the driver
carries it out. An elastic run (min_np/max_np) sizes each attempt to the cluster
(`elastic.Sizer`) and, while it runs below max_np, grows at a commit when slots return
(`elastic.FreeSlots`). Every attempt after the first, whether it follows a failure or a
resize, spends one of max_restarts.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

import cloudpickle

from hora._output_files import OutputFiles
from hora.checkpoint import remove_host_commits
from hora.config import RunConfig
from hora.engines import AttemptSpec
from hora.environment import build
from hora.errors import WorkerFailedError
from hora.job import callbacks
from hora.job.controller import (
    Attempt,
    Decision,
    Fail,
    Finish,
    Mark,
    RunController,
    SizeNext,
    StartAttempt,
    indented_story,
)
from hora.job.elastic import FreeSlots, Growth, Sizer, TooFewSlots, settle_given
from hora.job.metrics import MetricsLog
from hora.job.monitor import Group, Monitor
from hora.job.outcome import Limits, Outcome
from hora.job.policy import FailurePolicy
from hora.timeline import DriverTimeline


class StartableGroup(Group, Protocol):
    """What the driver builds for each attempt: a `WorkerGroup` (one attempt's launcher and its
    channel), or a test's fake. What it says of its engine (`capabilities`) is its launcher's
    (`hora.engines.Launcher`, where each is declared with its default)."""

    def spare(self) -> int: ...

    def slots_settled(self, held: int) -> bool: ...


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
        # One for the run: a restarted attempt's reports follow the ones before it.
        self.metrics = MetricsLog(config.reporters(), progress=config.progress)
        self.run_id = uuid.uuid4().hex[:16]  # every attempt's: where the ranks keep commits
        self.sizer: Sizer | None = None
        if config.elastic:
            if capacity is None:
                raise ValueError("an elastic run needs its engine's capacity")
            spec = self.spec
            self.sizer = Sizer(config.fewest_ranks, config.most_ranks, lambda h: capacity(spec, h))
        #: the run's decisions between attempts, and what it has spent and learnt
        self.controller = RunController(self.policy, config.np, config.elastic, config.fewest_ranks)
        self._first: StartableGroup | None = None  # built before anything else of the run
        self._settles = True  # whether the engine's count of free slots needs the settle time

    def run(self) -> list[Any]:
        config = self.config
        deadline = time.monotonic() + config.timeout if config.timeout else None
        self.output_files = None
        timeline = None
        controller = self.controller
        try:
            attempt = controller.attempt
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
            decision: Decision = StartAttempt(attempt)
            while True:
                match decision:
                    case StartAttempt(attempt=attempt, mark=mark):
                        _carry_out(mark, timeline)
                        outcome = self._attempt_explained(attempt, timeline, deadline)
                        decision = controller.ended(outcome)
                    case SizeNext(settle=settle, want=want, mark=mark):
                        _carry_out(mark, timeline)
                        decision = self._size(settle, want, deadline)
                    case Finish(results=results, np=np):
                        return [_loads(results.get(r)) for r in range(np)]
                    case Fail(error=error):
                        raise error from error.__cause__  # the rank's traceback, or none
        finally:
            if timeline is not None:
                timeline.close()
            self.metrics.close()
            if self.output_files is not None:
                self.output_files.close()
            # this host's commits of the run, however it ended (a failed or timed-out run's
            # included: nothing resumes them); other hosts' go with the run's last ranks, or stale
            remove_host_commits(self.run_id)

    # -- what follows an attempt ------------------------------------------------------------
    def _size(self, settle: bool, want: int | None, deadline: float | None) -> Decision:
        """Ask the cluster for the next attempt's size (an elastic run's): the controller's
        decision on its count."""
        assert self.sizer is not None  # only an elastic run's controller asks for a size
        wait = _wait(self.config.start_timeout, deadline)
        try:
            np = self.sizer.next_size(wait, settle=settle and self._settles, want=want)
        except TooFewSlots as short:
            return self.controller.too_few_slots(short.seen, short.waited)
        return self.controller.sized(np)

    def _attempt_explained(
        self, attempt: Attempt, timeline: DriverTimeline, deadline: float | None
    ) -> Outcome:
        """`_attempt`, where a restart the engine refuses (its slots are gone with a host) says
        what the restart was for, in the error's own class."""
        try:
            return self._attempt(attempt, timeline, deadline)
        except (ValueError, RuntimeError) as error:
            failed = self.controller.failed
            if failed and type(error) in (ValueError, RuntimeError):
                raise type(error)(_with_earlier(str(error), failed)) from error
            raise

    def _attempt(
        self, attempt: Attempt, timeline: DriverTimeline, deadline: float | None
    ) -> Outcome:
        config = self.config
        if attempt.index:
            ranks = f" ({attempt.np} ranks)" if config.elastic else ""
            _carry_out(Mark(f"hora: {attempt} starting{ranks}"), None)
        group, self._first = self._first or self.new_group(self._spec(attempt, deadline)), None
        can = group.capabilities
        self._settles = settle_given() or not can.exact_count
        in_place = config.elastic and can.reforms_in_place
        watchers = callbacks.for_attempt(
            attempt.index,
            timeline,
            self.metrics,
            self.output_files,
            log_callback_only=config.driver_log_verbosity == "log_callback_only",
        )
        payload = self.payload if isinstance(self.payload, bytes) else self.payload()
        monitor = Monitor(
            group,
            attempt.np,
            payload,
            config.collect_all,
            watchers,
            in_place=in_place,
            min_np=config.fewest_ranks,
            known_commit=self.controller.known_commit,
            growth=self._growth(attempt, in_place and can.grows_in_place, group, in_place),
        )
        try:
            return monitor.run(Limits(config.start_timeout, config.timeout, deadline))
        finally:
            monitor.finish()

    def _spec(self, attempt: Attempt, deadline: float | None) -> AttemptSpec:
        """What the launcher of `attempt` gets: its ranks, its wait for slots (never past the
        run's deadline), and the ranks' environment."""
        config = self.config
        env = (
            build.driver_env()
            | dict(config.env)
            | build.restart_env(attempt.index, attempt.max_restarts)
            | build.run_env(self.run_id, config.elastic)
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
    ) -> Growth | None:
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
        if group is not None and not settle_given():  # the engine's settle time, not the user's
            watch.settled = group.slots_settled  # skipped where a lost rank's slot is known free
        return Growth(watch, sizer.max_np, restart)


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


def _carry_out(mark: Mark, timeline: DriverTimeline | None) -> None:
    """Say what the controller's decision says, and mark it in the run's timeline."""
    if mark.say:
        sys.stdout.flush()
        print(mark.say, file=sys.stderr, flush=True)
    if mark.name and timeline is not None:
        timeline.mark(mark.name, mark.args)


def _with_earlier(text: str, failed: list[WorkerFailedError]) -> str:
    earlier = "\n".join(f"attempt {i + 1}: {indented_story(e)}" for i, e in enumerate(failed))
    return f"{text}\n\nThe restart was for what failed before:\n{earlier}"
