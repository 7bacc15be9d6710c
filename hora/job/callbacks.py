"""What the driver does beside deciding an attempt, as callbacks, and the attempt's explicit
states they see.

After Ray Train v2's controller (`controller/state.py`: one state at a time, callbacks told of
each change; `execution/callback.py`) and torch elastic's `WorkerState`. The attempt's
controller (`hora.job.attempt`) keeps only what decides its fate (who started, returned, failed
or stopped to grow, whether it grows) and tells its callbacks the rest: each rank's output, its
reports, each turn, each change of state. A feature of the driver (the timeline, live metrics,
output files, the console) is one callback here, not another parameter of the monitor and
branch of its reports; callbacks watch, and decide nothing.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol

from hora._output_files import OutputFiles
from hora.job._echo import echo
from hora.job.in_place import GrowingInPlace, ResizedInPlace
from hora.job.metrics import MetricsLog
from hora.job.state import AttemptState
from hora.timeline import DriverTimeline
from hora.wire.protocol import Metrics, Resumed, TimelineBatch


class Attempt(Protocol):
    """What a callback may read of the attempt (`hora.job.attempt.AttemptController`)."""

    @property
    def np(self) -> int: ...

    @property
    def state(self) -> AttemptState: ...


class MonitorCallback:
    """A hook into one attempt; every method does nothing unless overridden. All run on the
    monitor's thread (the caller's), in the order the callbacks were given."""

    def on_state(
        self, attempt: Attempt, previous: AttemptState | None, current: AttemptState
    ) -> None:
        """The attempt changed state (`previous` None: the monitor was just made)."""

    def on_tick(self, attempt: Attempt, now: float) -> None:
        """One turn of the monitor's loop (about every 50 ms), `now` its `time.monotonic()`."""

    def on_output(self, rank: int, where: str, stream: str, text: str) -> None:
        """A line of a rank's output; `where` names the rank as the console does ("1@host")."""

    def on_report(self, message: Any) -> None:
        """A rank's report the monitor itself does not act on (timeline, metrics, resumed)."""


class Console(MonitorCallback):
    """Every rank's output on the driver's own stdout/stderr, prefixed with its rank; with
    `log_callback_only`, only what the job logged (driver_log_verbosity)."""

    def __init__(self, log_callback_only: bool = False) -> None:
        self.log_callback_only = log_callback_only

    def on_output(self, rank: int, where: str, stream: str, text: str) -> None:
        if self.log_callback_only and stream != "log":
            return
        echo(f"[{where}] ", text, sys.stderr if stream == "stderr" else sys.stdout)


class WriteOutputFiles(MonitorCallback):
    """Each rank's output into its file (`output_filename`); the files are the run's."""

    def __init__(self, files: OutputFiles) -> None:
        self.files = files

    def on_output(self, rank: int, where: str, stream: str, text: str) -> None:
        self.files.write(rank, stream, text)


class RecordTimeline(MonitorCallback):
    """The ranks' timeline batches into the run's trace, and a mark where they resumed."""

    def __init__(self, timeline: DriverTimeline) -> None:
        self.timeline = timeline

    def on_report(self, message: Any) -> None:
        match message:
            case TimelineBatch(rank=rank, path=path, batch=batch):
                self.timeline.receive(rank, path, batch)
            case Resumed(commit=commit, size=size):
                self.timeline.mark("resumed", {"commit": commit, "made_by": size})
            case GrowingInPlace(before=before, size=size, why=why):
                self.timeline.mark("growing in place", {"from": before, "to": size, "why": why})
            case ResizedInPlace(before=before, size=size, seconds=seconds, commit=commit, why=why):
                args = {"from": before, "to": size, "seconds": round(seconds, 3), "why": why}
                self.timeline.mark("resized in place", args | {"commit": commit})


class CollectMetrics(MonitorCallback):
    """The ranks' `hora.report` into the run's metrics log: a new attempt of `np` ranks from its
    start, complete steps emitted at each turn."""

    def __init__(self, metrics: MetricsLog, index: int) -> None:
        self.metrics = metrics
        self.index = index  # the attempt's, from 0

    def on_state(
        self, attempt: Attempt, previous: AttemptState | None, current: AttemptState
    ) -> None:
        if previous is None:
            self.metrics.start_attempt(self.index, attempt.np)

    def on_tick(self, attempt: Attempt, now: float) -> None:
        if attempt.np != self.metrics.np:  # the attempt shrank in place: steps of fewer ranks
            self.metrics.start_attempt(self.index, attempt.np)
        self.metrics.flush()

    def on_report(self, message: Any) -> None:
        match message:
            case Metrics(rank=rank, step=step, values=values):
                self.metrics.receive(rank, step, values)
            case ResizedInPlace(before=before, size=size, seconds=seconds, commit=commit, why=why):
                event = {"from": before, "to": size, "seconds": round(seconds, 3)}
                self.metrics.resized(event | {"commit": commit, "why": why})


def for_attempt(
    attempt: int,
    timeline: DriverTimeline,
    metrics: MetricsLog,
    output_files: OutputFiles | None = None,
    log_callback_only: bool = False,
) -> list[MonitorCallback]:
    """The driver's callbacks for the attempt numbered `attempt` (from 0) of a run."""
    callbacks: list[MonitorCallback] = []
    if output_files is not None:
        callbacks.append(WriteOutputFiles(output_files))
    callbacks += [
        Console(log_callback_only),
        RecordTimeline(timeline),
        CollectMetrics(metrics, attempt),
    ]
    return callbacks
