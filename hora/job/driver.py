"""A run: attempts of a worker group, restarted by the failure policy until one succeeds.

torchrun's restart loop, for a whole group: when any rank fails, every rank is stopped, the
failure's story is printed, and a new group (new processes, or a new Spark barrier stage, with a
fresh rendezvous) runs the same job again. Nothing is kept in memory across attempts: the user's
checkpoints (`hora.checkpoint`) are what lets an attempt resume where the last one stopped.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import cloudpickle

from hora import environment
from hora._output_files import OutputFiles
from hora.config import RunConfig
from hora.errors import HoraError, RunTimeoutError, WorkerFailedError
from hora.job.metrics import MetricsLog
from hora.job.monitor import Group, Limits, Monitor
from hora.job.policy import FailurePolicy
from hora.timeline import DriverTimeline


class StartableGroup(Group, Protocol):
    """A group the driver can start and stop (`WorkerGroup`, or a test's fake)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class Attempt:
    """The `index`-th (from 0) of at most `total` attempts of a run."""

    index: int
    total: int

    def __str__(self) -> str:
        return f"attempt {self.index + 1} of {self.total}"


#: builds the (not yet started) group of one attempt, given the workers' extra environment
NewGroup = Callable[[Attempt, Mapping[str, str]], StartableGroup]


class Job:
    """Runs a pickled job; `run()` returns the unpickled results by rank."""

    def __init__(
        self,
        config: RunConfig,
        payload: bytes,
        new_group: NewGroup,
        policy: FailurePolicy | None = None,
    ):
        self.config = config
        self.payload = payload
        self.new_group = new_group
        self.policy = policy or FailurePolicy(config.max_restarts)
        self.failed: list[WorkerFailedError] = []  # one story per failed attempt, in order
        # One for the run: a restarted attempt's reports follow the ones before it.
        self.metrics = MetricsLog(config.reporters(), progress=config.progress)

    def run(self) -> list[Any]:
        config = self.config
        deadline = time.monotonic() + config.timeout if config.timeout else None
        # Before anything starts (a bad folder is a ValueError); one for the run: an attempt's
        # output follows the one before it.
        self.output_files = (
            OutputFiles(config.output_filename, config.np) if config.output_filename else None
        )
        timeline = DriverTimeline()  # one for the run: restarts are marks in the same trace
        try:
            attempt = Attempt(0, config.max_restarts + 1)
            while True:
                try:
                    results = self._attempt(attempt, timeline, deadline)
                except WorkerFailedError as error:
                    self.failed.append(error)
                    if self.policy.decide(error, len(self.failed)) == "fail":
                        raise self._final_error() from None
                    _say(f"hora: {attempt} failed: {_indented_story(error)}")
                    _say(f"hora: restarting every rank (max_restarts={config.max_restarts})")
                    timeline.mark("restart", {"failed": str(attempt), "cause": _first_line(error)})
                    attempt = Attempt(attempt.index + 1, attempt.total)
                    continue
                except RunTimeoutError as error:
                    if self.failed:
                        raise _after_failures(error, self.failed) from None
                    raise
                except (ValueError, RuntimeError) as error:
                    # A restart the engine refuses (its slots are gone with a host): say what the
                    # restart was for, in the error's own class.
                    if self.failed and type(error) in (ValueError, RuntimeError):
                        raise type(error)(_with_earlier(str(error), self.failed)) from error
                    raise
                return [_loads(results.get(r)) for r in range(config.np)]
        finally:
            timeline.close()
            self.metrics.close()
            if self.output_files is not None:
                self.output_files.close()

    def _attempt(
        self, attempt: Attempt, timeline: DriverTimeline, deadline: float | None
    ) -> dict[int, bytes | None]:
        config = self.config
        if attempt.index:
            _say(f"hora: {attempt} starting")
        env = (
            environment.driver_env()
            | dict(config.env)
            | environment.restart_env(attempt.index, config.max_restarts)
        )
        group = self.new_group(attempt, env)
        self.metrics.start_attempt(attempt.index, config.np)
        monitor = Monitor(
            group,
            config.np,
            self.payload,
            config.collect_all,
            timeline,
            log_callback_only=config.driver_log_verbosity == "log_callback_only",
            output_files=self.output_files,
            metrics=self.metrics,
        )
        try:
            group.start()
            return monitor.watch(Limits(config.start_timeout, config.timeout, deadline))
        finally:
            monitor.stopping = True
            group.stop()
            monitor.drain()

    def _final_error(self) -> WorkerFailedError:
        if len(self.failed) == 1:
            return self.failed[0]  # no restart was allowed: the story as it always read
        first = self.failed[0]
        total = len(self.failed)
        lines = [
            f"every attempt failed ({total} of {total}, max_restarts={self.config.max_restarts}); "
            "each attempt's root cause, first failure first:"
        ]
        for index, error in enumerate(self.failed):
            lines += ["", f"attempt {index + 1} of {total}: {_indented_story(error)}"]
        return WorkerFailedError(
            "\n".join(lines), first.rank, first.failed_ranks, attempts=tuple(self.failed)
        )


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
