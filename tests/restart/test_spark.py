"""Restarts on `local-cluster[2,1,1024]`: a rank that kills itself, an executor JVM killed.

One session for the module. After an executor is killed, Spark's standalone worker starts a new
one; the restart waits for its slot and runs a new barrier stage under a new job tag.
"""

from __future__ import annotations

import psutil
import pytest
import torch

import hora
from tests.restart import _cases
from tests.spark.conftest import (
    end_spark_jvm,
    start_spark,
    stop_spark,
    tagged_processes,
    worker_processes,
)

pytestmark = pytest.mark.spark

TOTAL = _cases.EPOCHS * _cases.STEPS_PER_EPOCH


@pytest.fixture(scope="module")
def spark():
    session = start_spark("local-cluster[2,1,1024]")
    yield session
    stop_spark(session)
    end_spark_jvm()  # tests/spark's own modules leave it to their package's fixture


def executor_pids() -> set[int]:
    """This test session's executor JVMs (another session on the machine may run its own)."""
    ours = set(tagged_processes())
    return {
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if p.pid in ours
        and any("CoarseGrainedExecutorBackend" in part for part in p.info["cmdline"] or ())
    }


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_killed_rank_and_lost_executor_each_restart_on_a_new_stage(spark, tmp_path, capfd):
    clean_dir, killed_dir, lost_dir = (tmp_path / n for n in ("clean", "killed", "lost"))
    for folder in (clean_dir, killed_dir, lost_dir):
        folder.mkdir()
    runner = hora.Runner(np=2, max_restarts=1)
    clean = runner.run(_cases.train, folder=str(clean_dir))
    k = _cases.MID_EPOCH_3

    # a rank SIGKILLs itself in the middle of epoch 3
    killed = runner.run(_cases.train, folder=str(killed_dir), fail_step=k)
    assert same_weights(killed["weights"], clean["weights"])
    assert _cases.steps_done(str(killed_dir)) == [(0, s) for s in range(k)] + [
        (1, s) for s in range(k, TOTAL)
    ]
    err = capfd.readouterr().err
    assert "hora: attempt 1 of 2 failed: rank 1 failed: killed by signal 9 (SIGKILL)" in err

    # the executor JVM under rank 1 is killed: Spark replaces it, hora runs a new stage
    before = executor_pids()
    lost = runner.run(_cases.train, folder=str(lost_dir), fail_step=k, how="kill_executor")
    assert same_weights(lost["weights"], clean["weights"])
    assert lost["start"] == k
    assert len(before - executor_pids()) == 1  # one executor JVM is gone, replaced by a new one
    out, err = capfd.readouterr()
    assert "killing executor JVM" in out
    assert "hora: attempt 1 of 2 failed: rank 1 failed:" in err
    assert "hora: attempt 2 of 2 starting" in err
    assert not worker_processes()
