"""Where each rank is stuck: its stacks reach the driver on a timeout, on a stall shutdown, and
when the user asks (SIGUSR1 to `hora run`), the stuck rank's first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import hora
from tests import _workers
from tests.conftest import wait_for_no_processes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sections(text: str) -> dict[str, str]:
    """'rank N: ...' sections of a stack report, by their first line's rank."""
    report = text[text.index("where each rank was") :]
    sections: dict[str, str] = {}
    current = None
    for line in report.splitlines()[1:]:
        if line.startswith("rank "):
            current = line.split(":", 1)[0]
            sections[current] = line
        elif current is not None:
            sections[current] += "\n" + line
    return sections


def test_a_timeout_shows_each_rank_in_user_code_or_in_its_collective() -> None:
    with pytest.raises(hora.RunTimeoutError) as info:
        hora.run(_workers.one_rank_waits_for_data, np=2, timeout=15)
    text = str(info.value)
    assert "where each rank was when the run reached timeout=15 s" in text
    ranks = _sections(text)
    assert set(ranks) == {"rank 0", "rank 1"}, text
    assert "in collectives: allreduce 'allreduce.grad.w'" in ranks["rank 0"]
    assert "in allreduce" in ranks["rank 0"]  # the user's call it waits in, not hora's insides
    assert "_engine.py" not in ranks["rank 0"] and "selectors.py" not in ranks["rank 0"]
    assert "in no collective" in ranks["rank 1"]
    assert "in one_rank_waits_for_data" in ranks["rank 1"]
    assert "in wait_for_data" in ranks["rank 1"]
    assert wait_for_no_processes() == []


def test_a_stall_shutdown_shows_the_rank_it_waits_for_first() -> None:
    env = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "3"}
    with pytest.raises(hora.WorkerFailedError) as info:
        hora.run(_workers.one_rank_waits_for_data, np=2, env=env)
    text = str(info.value)
    assert "collectives stalled for 3 s" in text
    assert "when the stall inspector stopped them (rank 1 first: the stall waits for them)" in text
    ranks = list(_sections(text))
    assert ranks[0] == "rank 1", text
    assert "in wait_for_data" in _sections(text)["rank 1"]


SCRIPT = """
import os, sys
from tests import _workers
print("up", os.environ["RANK"], flush=True)
_workers.one_rank_waits_for_data(sys.argv[1])
"""


def test_sigusr1_to_hora_run_prints_every_rank_and_the_run_goes_on(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    release = tmp_path / "data-arrived"
    driver = subprocess.Popen(
        [sys.executable, "-m", "hora", "run", "-np", "2", str(script), str(release)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    try:
        assert driver.stdout is not None
        seen = {driver.stdout.readline().strip() for _ in range(4)}
        assert seen == {"[0] up 0", "[1] up 1", "[0] ready 0", "[1] ready 1"}
        time.sleep(1.0)  # rank 0 goes on into its allreduce
        driver.send_signal(signal.SIGUSR1)
        time.sleep(2.0)
        release.touch()
        out, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert driver.returncode == 0, err
    assert "hora: where each rank was when you asked (SIGUSR1):" in err
    ranks = _sections(err)
    assert "in collectives: allreduce 'allreduce.grad.w'" in ranks["rank 0"]
    assert "in wait_for_data" in ranks["rank 1"]
    assert "[0] done 0" in out and "[1] done 1" in out
