"""An attempt's explicit states and the callbacks its monitor tells, read apart from processes:
the monitor driven by a fake worker group replaying typed messages, as a launcher and its
workers would send them (tests/job/_fakes.py)."""

from __future__ import annotations

import time
from typing import Any

import cloudpickle
import pytest

from hora._output_files import OutputFiles
from hora.errors import WorkerFailedError
from hora.job import callbacks
from hora.job.callbacks import MonitorCallback
from hora.job.metrics import MetricsLog
from hora.job.monitor import Monitor
from hora.job.outcome import Failed, Finished, Limits
from hora.job.state import AttemptState
from hora.timeline import DriverTimeline
from hora.wire.protocol import Error, Exited, Metrics, Output, Result
from tests.job._fakes import FakeGroup, hellos, succeeds

LIMITS = Limits(start_timeout=10.0, timeout=None, deadline=None)


class Recorder(MonitorCallback):
    """Everything a callback is told, in order."""

    def __init__(self) -> None:
        self.states: list[tuple[AttemptState | None, AttemptState]] = []
        self.outputs: list[tuple[int, str, str, str]] = []
        self.reports: list[Any] = []
        self.ticks = 0

    def on_state(self, monitor, previous, current) -> None:
        self.states.append((previous, current))

    def on_tick(self, monitor, now: float) -> None:
        self.ticks += 1

    def on_output(self, rank: int, where: str, stream: str, text: str) -> None:
        self.outputs.append((rank, where, stream, text))

    def on_report(self, message: Any) -> None:
        self.reports.append(message)


def watched(script: list[object], *extra: MonitorCallback) -> tuple[Monitor, Recorder, Any]:
    group = FakeGroup(script, {})
    recorder = Recorder()
    monitor = Monitor(group, 2, b"job", True, [recorder, *extra], min_np=2)
    outcome: Any = monitor.run(LIMITS)
    monitor.finish()
    match outcome:
        case Finished(results=results):
            return monitor, recorder, results
        case Failed(error=error):
            return monitor, recorder, error
    return monitor, recorder, outcome


def test_a_successful_attempt_goes_through_its_states_in_order():
    report = Metrics(0, 1, {"loss": 0.5})
    script = [*hellos(), Output(1, "stdout", "hello"), report, *succeeds()[2:]]
    monitor, recorder, results = watched(script)
    assert set(results) == {0, 1}
    assert [current for _, current in recorder.states] == [
        AttemptState.STARTING,
        AttemptState.RUNNING,
        AttemptState.FINISHING,
        AttemptState.SUCCEEDED,
        AttemptState.STOPPING,
    ]
    assert recorder.states[0] == (None, AttemptState.STARTING)
    assert monitor.state is AttemptState.STOPPING and monitor.state.ended
    assert recorder.outputs == [(1, "1", "stdout", "hello")]
    assert recorder.reports == [report]  # the monitor acts on output itself, not on metrics
    assert recorder.ticks > 0


def test_a_failed_attempt_fails_through_failing_and_keeps_its_story():
    error = Error(1, "ValueError: boom", "Traceback...\nValueError: boom", time.time())
    _, recorder, outcome = watched([*hellos(), error, Exited(1, 1)])
    assert isinstance(outcome, WorkerFailedError) and outcome.rank == 1
    states = [current for _, current in recorder.states]
    assert states[-3:] == [AttemptState.FAILING, AttemptState.FAILED, AttemptState.STOPPING]
    assert AttemptState.SUCCEEDED not in states


def test_the_drivers_callbacks_write_files_print_and_collect_metrics(tmp_path, capfd):
    files = OutputFiles(str(tmp_path / "out"), 2)
    metrics = MetricsLog(progress=False)
    timeline = DriverTimeline()
    script = [*hellos(), Output(0, "stdout", "line of 0"), Metrics(0, 1, {"loss": 2.0})]
    script += [Metrics(1, 1, {"loss": 4.0}), Result(0, cloudpickle.dumps(0))]
    script += [Result(1, cloudpickle.dumps(1)), Exited(0, 0), Exited(1, 0)]
    mine = callbacks.for_attempt(0, timeline, metrics, files)
    watched(script, *mine)
    files.close()
    metrics.close()
    timeline.close()
    assert "[0] line of 0" in capfd.readouterr().out
    written = [p.read_text() for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert "line of 0\n" in written
    assert metrics.history() == [{"step": 1, "loss": 3.0}]


@pytest.mark.parametrize("only_logs", [True, False])
def test_the_console_keeps_only_logged_lines_when_asked(only_logs, capfd):
    console = callbacks.Console(log_callback_only=only_logs)
    console.on_output(0, "0@host", "stdout", "printed")
    console.on_output(0, "0@host", "log", "logged")
    out = capfd.readouterr().out
    assert "[0@host] logged" in out
    assert ("[0@host] printed" in out) is not only_logs
