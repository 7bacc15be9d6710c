"""The restart rule, read apart from processes: the driver's loop driven by a fake worker group.

Each fake attempt replays a script of typed messages, as a launcher and workers would send them;
what is checked is what the driver does with them: restart or fail, with which story, how many
groups it started and stopped, which attempt number each group's workers were told.
"""

from __future__ import annotations

import json

import cloudpickle
import pytest

from hora.config import RunConfig
from hora.engines.base import AttemptSpec
from hora.errors import RunTimeoutError, WorkerFailedError
from hora.job.driver import Job
from hora.job.policy import FailurePolicy
from hora.wire.protocol import Hello, Payload, TimelineBatch
from tests.job._fakes import FakeConnection, FakeGroup, raises, run_scripted, sigkilled, succeeds


def test_policy_restarts_worker_failures_within_the_budget_and_never_timeouts():
    policy = FailurePolicy(max_restarts=2)
    failed = WorkerFailedError("rank 1 failed", 1, [1])
    assert [policy.decide(failed, n) for n in (1, 2, 3)] == ["restart", "restart", "fail"]
    assert policy.decide(RunTimeoutError("late"), 1) == "fail"
    assert FailurePolicy().decide(failed, 1) == "fail"


def test_a_killed_rank_restarts_the_whole_group_once(capfd):
    results, groups = run_scripted([sigkilled(1), succeeds()], max_restarts=1)
    assert results == ["value 0", "value 1"]
    assert [g.env["HORA_RESTART_COUNT"] for g in groups] == ["0", "1"]
    assert [g.env["TORCHELASTIC_RESTART_COUNT"] for g in groups] == ["0", "1"]
    assert {g.env["HORA_MAX_RESTARTS"] for g in groups} == {"1"}
    err = capfd.readouterr().err
    assert "hora: attempt 1 of 2 failed: rank 1 failed: killed by signal 9 (SIGKILL)" in err
    assert "hora: attempt 2 of 2 starting" in err


def test_the_payload_is_handed_to_each_attempts_ranks():
    groups: list[FakeGroup] = []
    conns: list[FakeConnection] = []

    class Recording(FakeGroup):
        def start(self) -> None:
            self.started = True
            for message in self.script:
                conn = FakeConnection() if isinstance(message, Hello) else None
                if conn:
                    conns.append(conn)
                self.events.put((conn, message))

    def new_group(spec: AttemptSpec) -> FakeGroup:
        groups.append(Recording([sigkilled(0), succeeds()][spec.attempt], dict(spec.env)))
        return groups[-1]

    Job(RunConfig(np=2, max_restarts=1, collect_all=False), b"job", new_group).run()
    assert [c.sent for c in conns] == [[Payload(b"job", r == 0)] for r in (0, 1)] * 2


def test_a_spent_budget_tells_every_attempts_story_first_failure_first():
    scripts = [raises(1, "first"), sigkilled(0), raises(1, "third")]
    with pytest.raises(WorkerFailedError) as info:
        run_scripted(scripts, max_restarts=2)
    error = info.value
    text = str(error)
    assert text.startswith("every attempt failed (3 of 3, max_restarts=2)")
    first = text.index("attempt 1 of 3: rank 1 failed: ValueError: first")
    second = text.index("attempt 2 of 3: rank 0 failed: killed by signal 9 (SIGKILL)")
    third = text.index("attempt 3 of 3: rank 1 failed: ValueError: third")
    assert first < second < third
    assert len(error.attempts) == 3 and error.rank == 1
    assert isinstance(cloudpickle.loads(cloudpickle.dumps(error)), WorkerFailedError)


def test_without_restarts_the_story_reads_as_it_always_did():
    with pytest.raises(WorkerFailedError) as info:
        run_scripted([raises(0, "once")])
    assert str(info.value).startswith("rank 0 failed: ValueError: once")
    assert info.value.attempts == ()


def test_a_timeout_is_not_restarted_and_names_the_earlier_failures():
    groups: list[FakeGroup] = []
    with pytest.raises(RunTimeoutError) as info:
        run_scripted([sigkilled(1), []], groups, max_restarts=3, start_timeout=0.5)
    assert len(groups) == 2  # the budget allowed three restarts; the timeout used none
    text = str(info.value)
    assert "did not start within start_timeout=0.5 s" in text
    assert "Timeouts are not restarted" in text
    assert "attempt 1: rank 1 failed: killed by signal 9 (SIGKILL)" in text


def test_the_timeline_marks_each_restart_on_the_drivers_track(tmp_path):
    trace = tmp_path / "trace.json"
    batch = [TimelineBatch(0, str(trace), [])]
    run_scripted([batch + sigkilled(1), batch + succeeds()], max_restarts=1)
    events = json.loads(trace.read_text())
    marks = [e for e in events if e.get("name") == "restart"]
    assert len(marks) == 1
    assert marks[0]["pid"] == -1 and marks[0]["ph"] == "i"
    assert marks[0]["args"]["failed"] == "attempt 1 of 2"
    assert "killed by signal 9" in marks[0]["args"]["cause"]
    driver = [e for e in events if e.get("pid") == -1 and e.get("name") == "process_name"]
    assert driver[0]["args"]["name"] == "driver"


@pytest.mark.parametrize("bad", [-1, 1.0, True, "2"])
def test_bad_max_restarts_is_a_value_error_before_launch(bad):
    with pytest.raises(ValueError, match="max_restarts must be an int >= 0"):
        RunConfig(np=2, max_restarts=bad)
    assert RunConfig(np=2, max_restarts=None).max_restarts == 0  # None: the default
