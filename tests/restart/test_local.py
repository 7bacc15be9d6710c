"""Restarts with real local processes: a killed rank, a spent budget, hvd.elastic with disk.

Each training job writes its checkpoints and its step log in the test's folder; the weights are
compared bitwise with one uninterrupted run of the same job (shared by the module).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hora
from hora.spark import TorchDistributor
from tests.conftest import tagged_processes
from tests.restart import _cases

TOTAL = _cases.EPOCHS * _cases.STEPS_PER_EPOCH


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, torch.Tensor]:
    folder = tmp_path_factory.mktemp("uninterrupted")
    out = hora.Runner(np=-2).run(_cases.train, folder=str(folder))
    assert _cases.steps_done(str(folder)) == [(0, s) for s in range(TOTAL)]
    return out["weights"]


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_rank_killed_mid_epoch_3_resumes_from_its_checkpoint(tmp_path, uninterrupted, capfd):
    out = hora.Runner(np=-2, max_restarts=1).run(
        _cases.train, folder=str(tmp_path), fail_step=_cases.MID_EPOCH_3
    )
    assert same_weights(out["weights"], uninterrupted)  # bitwise, on CPU
    done = _cases.steps_done(str(tmp_path))
    k = _cases.MID_EPOCH_3
    assert done == [(0, s) for s in range(k)] + [(1, s) for s in range(k, TOTAL)]
    assert out["start"] == k
    err = capfd.readouterr()
    assert "hora: attempt 1 of 2 failed: rank 1 failed: killed by signal 9 (SIGKILL)" in err.err
    assert "hora: attempt 2 of 2 starting" in err.err
    assert f"rank 0: attempt 1 starts at step {k}" in err.out
    assert not tagged_processes()


def test_a_failure_before_the_first_checkpoint_restarts_from_scratch(tmp_path, uninterrupted):
    out = hora.Runner(np=-2, max_restarts=1).run(
        _cases.train, folder=str(tmp_path), fail_step=0, how="raise"
    )
    assert out["start"] == 0
    assert _cases.steps_done(str(tmp_path)) == [(1, s) for s in range(TOTAL)]
    assert same_weights(out["weights"], uninterrupted)


def test_a_spent_budget_is_three_attempts_and_one_error_with_three_stories(tmp_path):
    with pytest.raises(hora.WorkerFailedError) as info:
        hora.run(_cases.always_fails, (str(tmp_path),), np=2, max_restarts=2)
    marks = sorted(p.name for p in tmp_path.iterdir())
    assert marks == [f"attempt-{a}-rank-{r}" for a in range(3) for r in range(2)]
    text = str(info.value)
    assert text.startswith("every attempt failed (3 of 3, max_restarts=2)")
    stories = [
        f"attempt {a + 1} of 3: rank 1 failed: RuntimeError: always fails (attempt {a})"
        for a in range(3)
    ]
    positions = [text.index(story) for story in stories]
    assert positions == sorted(positions)
    assert len(info.value.attempts) == 3
    assert not tagged_processes()


def test_elastic_restores_in_memory_and_a_lost_process_restarts_from_disk(tmp_path):
    out = hora.Runner(np=-2, max_restarts=1).run(_cases.elastic_then_lost, folder=str(tmp_path))
    # attempt 0's failed collective was healed in the same processes, at step 5
    assert Path(tmp_path, "resets.txt").read_text().splitlines() == ["0 5"]
    assert out["start"] == 9  # attempt 1 started from the step-8 checkpoint on disk


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_bad_max_restarts_fails_at_every_door_before_launch(bad):
    with pytest.raises(ValueError, match="max_restarts must be an int >= 0"):
        hora.Runner(np=-2, max_restarts=bad)
    with pytest.raises(ValueError, match="max_restarts must be an int >= 0"):
        hora.run(_cases.always_fails, ("/nonexistent",), np=2, max_restarts=bad)
    with pytest.raises(ValueError, match="max_restarts must be an int >= 0"):
        TorchDistributor(num_processes=2, use_gpu=False, max_restarts=bad)


SCRIPT = """
import os
if os.environ["RANK"] == "1" and os.environ["HORA_RESTART_COUNT"] == "0":
    raise SystemExit("rank 1 fails in the first attempt")
print("attempt", os.environ["HORA_RESTART_COUNT"], "of", int(os.environ["HORA_MAX_RESTARTS"]) + 1)
"""


def test_the_command_line_restarts_and_refuses_a_negative_budget(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)

    def hora_run(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "hora", "run", "-np", "2", *args, str(script)]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    done = hora_run("--max-restarts", "1")
    assert done.returncode == 0, done.stderr
    assert "[1] attempt 1 of 2" in done.stdout
    assert "hora: attempt 1 of 2 failed: rank 1 failed: called sys.exit(" in done.stderr
    bad = hora_run("--max-restarts", "-1")
    assert bad.returncode == 2
    assert "max_restarts must be an int >= 0" in bad.stderr
