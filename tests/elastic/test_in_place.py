"""A lost rank of an elastic run on the local engine: the survivors re-form the world in place,
in the same processes, from the last in-memory commit (no restart, no settle time)."""

from __future__ import annotations

import re

import torch

import hora
from tests.elastic import _jobs

SAMPLES = 96


def test_a_killed_rank_s_survivors_train_on_in_place_in_the_same_processes(
    tmp_path, monkeypatch, capfd
):
    """np=3, min_np=2: rank 2 SIGKILLs itself mid-epoch; ranks 0 and 1 keep their processes,
    become a world of 2 and finish. Every sample of every epoch is trained exactly once in the
    final model, which equals one process trained on the same steps."""
    monkeypatch.setenv("HORA_ELASTIC_SETTLE_SECONDS", "30")  # a restart would be slow to show
    plan = _jobs.Plan(str(tmp_path), full=3, samples=SAMPLES, fault="self", fault_commit=2)
    results = hora.run(_jobs.train, (plan,), np=3, min_np=2, timeout=240)
    steps, worlds, starts = _jobs.kept_steps(str(tmp_path))
    logs = _jobs.read_logs(str(tmp_path))
    assert sorted(logs) == [(0, 0), (0, 1)], sorted(logs)  # one attempt, re-formed once
    assert worlds == [3, 2], worlds
    assert starts[0] == 0 and starts[1] > 0, starts
    first_pids = {r: logs[0, 0][r][0]["pid"] for r in range(3)}
    again_pids = {r: logs[0, 1][r][0]["pid"] for r in range(2)}
    assert again_pids == {0: first_pids[0], 1: first_pids[1]}, (first_pids, again_pids)
    assert sorted(r["pid"] for r in results) == sorted(again_pids.values())
    assert _jobs.samples_per_epoch(steps) == {e: list(range(SAMPLES)) for e in range(plan.epochs)}
    want = _jobs.reference(plan, steps)
    assert [r["world"] for r in results] == [2, 2]
    for r in results:
        for key, value in want.items():
            torch.testing.assert_close(r["weights"][key], value, rtol=0, atol=1e-10)
    assert logs[0, 1][0][0]["reset_sizes"] == [2]  # the reset callbacks got the new size
    err = capfd.readouterr().err
    assert "hora: restarting" not in err, err
    assert re.search(
        r"hora: resized in place from 3 to 2 ranks in [0-9.]+ s \(rank 2 failed: killed by "
        rf"signal 9 \(SIGKILL\)\); the ranks went on from commit {starts[1]}",
        err,
    ), err
