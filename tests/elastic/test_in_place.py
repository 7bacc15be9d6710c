"""A lost rank of an elastic run on the local engine: the survivors re-form the world in place,
in the same processes, from the last in-memory commit (no restart, no settle time); then the run
grows back in place: a new rank joins the running ones, which keep their processes, and takes
their state by broadcast (no restart, no commit store)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

import hora
from tests.elastic import _jobs

SAMPLES = 96


def test_a_killed_rank_s_survivors_train_on_in_place_and_grow_back_in_the_same_processes(
    tmp_path, monkeypatch, capfd
):
    """np=3, min_np=2, max_np=3: rank 2 SIGKILLs itself mid-epoch; ranks 0 and 1 keep their
    processes and become a world of 2; the local engine has room for 3, so after the settle
    time a new rank 2 starts and, at the survivors' next commit (held until it waits to join),
    the three re-form a world of 3 and finish. Every sample of every epoch is trained exactly
    once in the final model, which equals one process trained on the same steps."""
    monkeypatch.setenv("HORA_ELASTIC_SETTLE_SECONDS", "1")
    Path(tmp_path, _jobs.BACK_MARK).touch()  # the local engine's slots are always there
    # a commit every 3 steps, the kill after the first: 36 samples done at 3 ranks, 24 at 2,
    # and the 36 left of the epoch deal evenly to 3 ranks (no padding repeats one)
    plan = _jobs.Plan(
        str(tmp_path),
        full=3,
        samples=SAMPLES,
        commit_every=3,
        fault="self",
        fault_commit=1,
        wait_for_return=True,
        report=True,
    )
    results, history = hora.run(
        _jobs.train, (plan,), np=3, min_np=2, timeout=240, return_metrics=True, progress=False
    )
    steps, worlds, starts = _jobs.kept_steps(str(tmp_path))
    # one attempt: its first world, shrunk in place, grown back in place
    logs = _jobs.check_in_place(str(tmp_path), results, small=2)
    assert worlds == [3, 2, 3], worlds
    assert starts[0] == 0 and 0 < starts[1] < starts[2], starts
    assert _jobs.samples_per_epoch(steps) == {e: list(range(SAMPLES)) for e in range(plan.epochs)}
    want = _jobs.reference(plan, steps)
    for r in results:
        for key, value in want.items():
            torch.testing.assert_close(r["weights"][key], value, rtol=0, atol=1e-10)
    # the reset callbacks got the new size on every rank, the new one included
    assert logs[0, 1][0][0]["reset_sizes"] == [2]
    assert logs[0, 2][0][0]["reset_sizes"] == [2, 3]
    assert logs[0, 2][2][0]["reset_sizes"] == [3]
    assert {logs[0, 2][r][0]["start"] for r in range(3)} == {starts[2]}  # the new one's too
    err = capfd.readouterr().err
    assert "hora: restarting" not in err and "hora: resizing from" not in err, err
    assert re.search(
        r"hora: resized in place from 3 to 2 ranks in [0-9.]+ s \(rank 2 failed: killed by "
        rf"signal 9 \(SIGKILL\)\); the ranks went on from commit {starts[1]}",
        err,
    ), err
    _jobs.check_grew_in_place(err, 2, 3, starts[2])
    # hora.report's history shows each resize at the first step after it
    resizes = [h["resized"] for h in history if "resized" in h]
    assert [(r["from"], r["to"], r["commit"]) for r in resizes] == [
        (3, 2, starts[1]),
        (2, 3, starts[2]),
    ], resizes
    assert "rank 2 failed" in resizes[0]["why"] and resizes[1]["why"] == "free slots for 3 ranks"


def test_an_fsdp2_sharded_state_re_forms_in_place_with_reshard(tmp_path, monkeypatch, capfd):
    """The same run with an FSDP2 twin of the MLP in the state (`reshard=`): after the kill the
    survivors rebuild it sharded over 2 ranks and load the last DCP commit; to grow, the running
    ranks rebuild it over 3 and every rank, the new one too, loads the commit they stopped at.
    The survivors keep their PIDs, and the sharded weights equal one process's."""
    monkeypatch.setenv("HORA_ELASTIC_SETTLE_SECONDS", "1")
    Path(tmp_path, _jobs.BACK_MARK).touch()
    plan = _jobs.Plan(
        str(tmp_path),
        full=3,
        samples=SAMPLES,
        commit_every=3,
        fault="self",
        fault_commit=1,
        wait_for_return=True,
        fsdp=True,
        reshard=True,
    )
    results = hora.run(_jobs.train, (plan,), np=3, min_np=2, timeout=240)
    steps, worlds, starts = _jobs.kept_steps(str(tmp_path))
    _jobs.check_in_place(str(tmp_path), results, small=2)
    assert worlds == [3, 2, 3], worlds
    assert starts[0] == 0 and 0 < starts[1] < starts[2], starts
    assert _jobs.samples_per_epoch(steps) == {e: list(range(SAMPLES)) for e in range(plan.epochs)}
    want = _jobs.reference(plan, steps)
    assert [(r["world"], r["mesh"]) for r in results] == [(3, 3)] * 3  # sharded over 3
    for r in results:
        for key, value in want.items():
            torch.testing.assert_close(r["weights"][key], value, rtol=0, atol=1e-10)
            torch.testing.assert_close(r["sharded"][key], value, rtol=0, atol=1e-9)
    err = capfd.readouterr().err
    assert "hora: restarting" not in err and "hora: resizing from" not in err, err
    assert "hora: resized in place from 3 to 2 ranks" in err, err
    assert "hora: resized in place from 2 to 3 ranks" in err, err
