"""What the driver does beside watching an attempt, as callbacks on its monitor, and the
attempt's explicit states they see.

After Ray Train v2's controller (`controller/state.py`: one state at a time, callbacks told of
each change; `execution/callback.py`) and torch elastic's `WorkerState`. The monitor keeps only
what decides an attempt's fate (who started, returned, failed or stopped to grow) and tells its
callbacks the rest: each rank's output, its reports, each turn of its loop, each change of
state. A feature of the driver (the timeline, live metrics, output files, the growth watch, the
console) is one callback here, not another parameter of `Monitor` and branch of its reports.
"""

from __future__ import annotations

import enum
import sys
from typing import Any, Protocol

from hora._output_files import OutputFiles
from hora.job._echo import echo
from hora.job.elastic import FreeSlots
from hora.job.in_place import GrowingInPlace, ResizedInPlace
from hora.job.metrics import MetricsLog
from hora.timeline import DriverTimeline
from hora.wire.protocol import HostsUpdated, Metrics, Resumed, TimelineBatch


class AttemptState(enum.Enum):
    """Where one attempt is; the last four end it."""

    STARTING = "starting"  # the group runs; not every rank has connected yet
    RUNNING = "running"  # every rank has the job; results are due
    FINISHING = "finishing"  # every result is in; the ranks get their grace to exit
    FAILING = "failing"  # a rank failed: its story waits for the cause and the ranks' stacks
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed out"
    RESIZED = "resized"  # every rank stopped at a commit so that the run can grow
    STOPPING = "stopping"  # the group was stopped: what the ranks said last is drained

    @property
    def ended(self) -> bool:
        return self in _ENDED


_ENDED = frozenset(
    {
        AttemptState.SUCCEEDED,
        AttemptState.FAILED,
        AttemptState.TIMED_OUT,
        AttemptState.RESIZED,
        AttemptState.STOPPING,
    }
)


class Monitor(Protocol):
    """What a callback may use of the monitor (`hora.job.monitor.Monitor`)."""

    @property
    def np(self) -> int: ...

    @property
    def state(self) -> AttemptState: ...

    @property
    def may_grow(self) -> bool: ...

    def send_all(self, message: Any) -> None:
        """Send `message` to every rank whose channel is still open."""

    def grow_in_place(self, size: int) -> bool:
        """Start new ranks that the running ones re-form with; False when they cannot."""


class MonitorCallback:
    """A hook into one attempt's monitor; every method does nothing unless overridden. All run on
    the monitor's thread (the caller's), in the order the callbacks were given."""

    def on_state(
        self, monitor: Monitor, previous: AttemptState | None, current: AttemptState
    ) -> None:
        """The attempt changed state (`previous` None: the monitor was just made)."""

    def on_tick(self, monitor: Monitor, now: float) -> None:
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

    def __init__(self, metrics: MetricsLog, attempt: int) -> None:
        self.metrics = metrics
        self.attempt = attempt

    def on_state(
        self, monitor: Monitor, previous: AttemptState | None, current: AttemptState
    ) -> None:
        if previous is None:
            self.metrics.start_attempt(self.attempt, monitor.np)

    def on_tick(self, monitor: Monitor, now: float) -> None:
        if monitor.np != self.metrics.np:  # the attempt shrank in place: steps of fewer ranks
            self.metrics.start_attempt(self.attempt, monitor.np)
        self.metrics.flush()

    def on_report(self, message: Any) -> None:
        match message:
            case Metrics(rank=rank, step=step, values=values):
                self.metrics.receive(rank, step, values)
            case ResizedInPlace(before=before, size=size, seconds=seconds, commit=commit, why=why):
                event = {"from": before, "to": size, "seconds": round(seconds, 3)}
                self.metrics.resized(event | {"commit": commit, "why": why})


class Grow(MonitorCallback):
    """An elastic attempt that may grow: while every rank runs, once the cluster has had room
    for more for the settle time, grow in place where the ranks can (`hora.job.world`), else
    (with a restart left) ask them all to stop at their next commit. After a resize in place,
    or a growth in place given up (a new rank was lost), it watches again."""

    def __init__(self, growth: FreeSlots, max_np: int, restart: bool = True) -> None:
        self.growth = growth
        self.max_np = max_np
        self.restart = restart  # the budget has an attempt left to grow into
        self.in_place = False  # the watch fired and new ranks were started

    def on_tick(self, monitor: Monitor, now: float) -> None:
        if monitor.state is not AttemptState.RUNNING or not monitor.may_grow:
            return
        if monitor.np != self.growth.np or self.in_place:  # resized, or the growth given up
            self.growth = FreeSlots(monitor.np, self.growth.capacity, self.growth.steady)
            self.in_place = False
        if monitor.np >= self.max_np or not self.growth.due(now):
            return
        self.in_place = monitor.grow_in_place(min(self.max_np, self.growth.seen))
        if not self.in_place and self.restart:
            monitor.send_all(HostsUpdated())


def for_attempt(
    attempt: int,
    timeline: DriverTimeline,
    metrics: MetricsLog,
    output_files: OutputFiles | None = None,
    growth: Grow | None = None,
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
    if growth is not None:
        callbacks.append(growth)
    return callbacks
