"""The stall inspector: its logic against a real Coordinator on a hand-driven clock, then real jobs
that stall (under hora's launcher and as bare ranks) with small check and shutdown times."""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import hora
from hora.collectives._control.negotiation import Coordinator
from hora.collectives._control.stall import MAX_NAMES, StallInspector, StallSettings
from hora.collectives._messages import ALLREDUCE, Request
from hora.errors import RunTimeoutError, WorkerFailedError
from tests.collectives import _stall_cases

REPO = Path(__file__).resolve().parents[2]


def req(name: str, process_set_id: int = 0) -> Request:
    return Request(name, ALLREDUCE, process_set_id, ("float32",), ((4,),), "cpu", 16)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Rig:
    """A coordinator, an inspector on a hand-driven clock, and what it reported."""

    def __init__(self, size: int = 2, check: float = 1.0, shutdown: float = 3.0, **kw) -> None:
        self.coord = Coordinator(size, 1 << 20)
        self.clock = Clock()
        self.reports: list[str | None] = []
        settings = StallSettings(check, shutdown, **kw)
        self.inspector = StallInspector(settings, self.coord, self.reports.append, self.clock)

    def round(self, at: float) -> str | None:
        """One coordinator round at time `at`, as the engine runs it: take, then inspect."""
        self.clock.now = at
        return self.inspector.inspect(bool(self.coord.take()))

    def idle(self, until: float) -> str | None:
        """Nothing else happens: wake up whenever the inspector asks, as the engine's select does,
        until `until` or a shutdown."""
        while (wait := self.inspector.wake_in()) is not None and self.clock.now + wait <= until:
            reason = self.round(self.clock.now + wait)
            if reason is not None:
                return reason
        return None


def test_warns_every_check_time_then_stops_with_the_diagnosis() -> None:
    rig = Rig(check=1.0, shutdown=3.0)
    rig.coord.submit(0, req("x"))
    assert rig.round(0.0) is None and rig.reports == []
    assert rig.inspector.wake_in() == pytest.approx(1.0)
    assert rig.round(0.5) is None and rig.reports == []
    for t in (1.0, 2.0):
        assert rig.round(t) is None
    assert rig.reports == [
        f"tensor 'x' waiting for {t} s: ready on ranks [0], missing on ranks [1]. Ranks that "
        "submit different names, or a rank that skips a collective, wait forever; every rank is "
        "stopped at 3 s (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)."
        for t in (1, 2)
    ]
    assert rig.round(2.5) is None and len(rig.reports) == 2  # no warning between checks
    reason = rig.round(3.0)
    assert reason is not None and reason.startswith("Horovod has been shut down: ")
    assert "tensor 'x' waiting for 3 s: ready on ranks [0], missing on ranks [1]" in reason
    assert rig.reports[-1] == (
        "stopping every rank after 3 s (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS): "
        "tensor 'x' waiting for 3 s: ready on ranks [0], missing on ranks [1]"
    )
    assert rig.round(10.0) is None and rig.inspector.wake_in() is None  # stopped once


def test_a_resolved_stall_is_withdrawn_and_a_new_one_starts_from_zero() -> None:
    rig = Rig(check=1.0, shutdown=3.0)
    rig.coord.submit(0, req("x"))
    rig.round(0.0)
    rig.round(1.0)
    rig.coord.submit(1, req("x"))
    assert rig.round(1.2) is None
    assert rig.reports[-1] is None  # the driver forgets the warning
    assert rig.inspector.wake_in() is None  # nothing waits: no wake-up
    rig.coord.submit(1, req("y"))
    rig.round(2.5)
    assert rig.round(3.4) is None and rig.reports[-1] is None
    rig.round(3.5)
    assert rig.reports[-1] is not None and "tensor 'y' waiting for 1 s" in rig.reports[-1]


def test_a_name_submitted_again_is_a_new_operation() -> None:
    """A name reused every step must not look old because some instance of it always waits."""
    rig = Rig(check=1.0, shutdown=3.0)
    rig.coord.submit(0, req("grad"))
    rig.round(0.0)
    for step in range(1, 40):  # each round completes one instance and starts the next
        rig.coord.submit(1, req("grad"))
        rig.coord.submit(0, req("grad"))
        assert rig.round(step * 0.09) is None
    assert rig.reports == []
    rig.idle(until=0.09 * 39 + 1.5)  # the last instance really waits now
    assert len(rig.reports) == 1 and "tensor 'grad' waiting for 1 s" in str(rig.reports[0])


def test_only_members_of_a_process_set_and_no_joined_rank_are_missing() -> None:
    rig = Rig(size=4, check=1.0, shutdown=0.0)
    rig.coord.set_process_set(1, (0, 1))
    rig.coord.submit(0, req("in_set", process_set_id=1))
    rig.coord.join(3)
    rig.coord.submit(0, req("g"))
    rig.round(0.0)
    rig.round(1.0)
    (text,) = rig.reports
    assert text is not None
    assert "tensor 'in_set' in process set 1 waiting for 1 s: ready on ranks [0], missing on " \
        "ranks [1]" in text  # fmt: skip
    assert "tensor 'g' waiting for 1 s: ready on ranks [0], joined ranks [3], missing on " \
        "ranks [1, 2]" in text  # fmt: skip
    assert "join waiting for 1 s with no collective completing: joined ranks [3], missing " \
        "ranks [0, 1, 2]" in text  # fmt: skip
    assert "nothing will stop them" in text
    for t in range(2, 30):  # HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=0: warnings only
        assert rig.round(float(t)) is None
    assert len(rig.reports) == 29


def test_a_join_waits_only_while_nothing_completes() -> None:
    """Uneven data: rank 0 joined and the others go on reducing; that is no stall."""
    rig = Rig(size=2, check=1.0, shutdown=3.0)
    rig.coord.join(0)
    rig.round(0.0)
    for step in range(1, 60):
        rig.coord.submit(1, req(f"step.{step}"))  # completes at once: rank 0 has joined
        assert rig.round(step * 0.1) is None
    assert rig.reports == []
    assert rig.idle(until=20.0) is not None  # then rank 1 stops submitting and never joins
    assert 8.9 <= rig.clock.now <= 9.1  # 3 s after the last completion, give or take a sample
    assert rig.reports[-1] is not None and "join waiting for 3 s" in rig.reports[-1]


def test_long_lists_are_capped() -> None:
    rig = Rig(size=2, check=1.0, shutdown=3.0)
    for k in range(MAX_NAMES + 3):
        rig.coord.submit(0, req(f"t{k}"))
    rig.round(0.0)
    rig.round(1.0)
    text = str(rig.reports[0])
    assert "tensors 't0', 't1', 't2', 't3', 't4' and 3 more waiting for 1 s" in text
    assert "'t5'" not in text


def test_disabled_says_and_stops_nothing() -> None:
    rig = Rig(check=1.0, shutdown=3.0, enabled=False)
    rig.coord.submit(0, req("x"))
    for t in range(10):
        assert rig.round(float(t)) is None
    assert rig.reports == [] and rig.inspector.wake_in() is None


def test_shutdown_shorter_than_the_check_time_still_stops() -> None:
    rig = Rig(check=60.0, shutdown=2.0)
    rig.coord.submit(0, req("x"))
    rig.round(0.0)
    assert rig.inspector.wake_in() == pytest.approx(2.0)
    reason = rig.round(2.0)
    assert reason is not None and "tensor 'x' waiting for 2 s" in reason


def test_settings_from_the_environment() -> None:
    assert StallSettings.from_env({}) == StallSettings(60.0, 600.0, True)
    env = {
        "HOROVOD_STALL_CHECK_TIME_SECONDS": "5",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "0",
        "HOROVOD_STALL_CHECK_DISABLE": "1",
    }
    assert StallSettings.from_env(env) == StallSettings(5.0, 0.0, False)
    for value, enabled in (("0", True), ("", True), ("true", False), ("2", False)):
        assert StallSettings.from_env({"HOROVOD_STALL_CHECK_DISABLE": value}).enabled is enabled
    bad = (
        ("HOROVOD_STALL_CHECK_TIME_SECONDS", "0"),
        ("HOROVOD_STALL_CHECK_TIME_SECONDS", "soon"),
        ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "-1"),
        ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "nan"),
        ("HOROVOD_STALL_CHECK_DISABLE", "maybe"),
    )
    for name, value in bad:
        with pytest.raises(ValueError, match=name):
            StallSettings.from_env({name: value})
    assert math.isclose(StallSettings(60.0, 600.0).resolution_s, 1.0)
    assert math.isclose(StallSettings(1.0, 3.0).resolution_s, 0.1)


# ----- real jobs ---------------------------------------------------------------------------------
def _stall_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("hora: stall: ")]


def test_a_stall_is_reported_on_the_driver_then_every_rank_is_stopped(tmp_path, capfd) -> None:
    path = str(tmp_path / "outcome")
    env = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "4"}
    with pytest.raises(WorkerFailedError) as failed:
        hora.run(_stall_cases.shut_down_by_stall, args=(path,), np=3, env=env)
    lines = _stall_lines(capfd.readouterr().err)
    warnings = [line for line in lines if "stopping" not in line]
    assert len(warnings) >= 2, lines  # repeated, every check time
    x = r"tensor 'allreduce.x' waiting for \d+ s: ready on ranks \[0\], missing on ranks \[1, 2\]"
    y = r"tensor 'allreduce.y' waiting for \d+ s: ready on ranks \[1\], missing on ranks \[0, 2\]"
    for line in warnings:  # each names what had waited a check time by then: x, y or both
        assert re.search(x, line) or re.search(y, line), line
    assert re.search(x, warnings[-1]) and re.search(y, warnings[-1]), warnings
    assert lines[-1].startswith("hora: stall: stopping every rank after 4 s"), lines
    diagnosis = "collectives stalled for 4 s (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS): tensor"
    for r in range(3):  # ranks 0 and 1 in their stalled allreduce, rank 2 at its next one
        text = Path(f"{path}.{r}").read_text()
        assert text.startswith("HorovodInternalError: Horovod has been shut down: "), text
        assert diagnosis in text and "missing on ranks [1, 2]" in text, text
    assert "HorovodInternalError: Horovod has been shut down: " + diagnosis in str(failed.value)


def test_the_job_timeout_repeats_the_stall(capfd) -> None:
    env = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "600"}
    with pytest.raises(RunTimeoutError) as timed_out:
        hora.run(_stall_cases.stalled_until_timeout, np=2, env=env, timeout=12)
    message = str(timed_out.value)
    assert "They were stalled: tensor 'allreduce.x' waiting for" in message, message
    assert "ready on ranks [0], missing on ranks [1]" in message, message
    assert _stall_lines(capfd.readouterr().err)


def test_check_disable_is_honoured(capfd) -> None:
    env = {
        "HOROVOD_STALL_CHECK_DISABLE": "1",
        "HOROVOD_STALL_CHECK_TIME_SECONDS": "0.5",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "1",
    }
    assert hora.run(_stall_cases.late_rank, args=(3.0,), np=2, env=env) == [2.0, 2.0]
    assert not _stall_lines(capfd.readouterr().err)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_without_a_launcher_rank_0_warns_on_its_stderr() -> None:
    port = _free_port()
    procs = []
    for rank in (0, 1):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
        env |= {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port), "HOROVOD_STALL_CHECK_TIME_SECONDS": "1",
                "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "3"}  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.collectives._stall_cases", "bare_rank"],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate(timeout=90) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    warnings = _stall_lines(outs[0][1])
    assert len(warnings) >= 2, outs[0][1]
    # each rank's tensor waits for the other rank; which one rank 0 saw first depends on timing
    for name, missing in (("x", 1), ("y", 0)):
        assert any(
            f"tensor 'allreduce.{name}' waiting for" in w and f"missing on ranks [{missing}]" in w
            for w in warnings
        ), warnings
    assert not _stall_lines(outs[1][1])  # only the coordinator inspects
    for out, _ in outs:
        assert "HorovodInternalError: Horovod has been shut down: collectives stalled" in out, out
