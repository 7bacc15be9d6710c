"""A lost rank of a Keras elastic run on the local engine: the survivors re-form the world in
place, as torch's do, and `fit` traces its function again in the new world (the size baked into
the first trace would otherwise still scale the gradients). Then the run grows back in place: a
new rank, whose optimizer has no variables yet, takes the running ranks' weights, momentum and
values by broadcast. A TensorFlowState of plain tf.Variables grows in place too."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

import hora
from tests.elastic import _jobs, _keras_jobs

SAMPLES = 96


def test_a_killed_rank_s_keras_survivors_train_on_in_place(tmp_path, monkeypatch, capfd):
    """np=3, min_np=2: rank 2 SIGKILLs itself mid-epoch; ranks 0 and 1 keep their processes,
    become a world of 2 and finish. Every sample of every epoch is trained exactly once in the
    final model, which equals one Keras process trained on the same steps."""
    monkeypatch.setenv("HORA_ELASTIC_SETTLE_SECONDS", "600")  # no growth (by a restart) here
    plan = _jobs.Plan(
        str(tmp_path), full=3, epochs=2, samples=SAMPLES, fault="self", fault_commit=2
    )
    results = hora.run(_keras_jobs.train, (plan,), np=3, min_np=2, timeout=300)
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
    assert [r["world"] for r in results] == [2, 2]
    assert logs[0, 1][0][0]["reset_sizes"] == [2]  # the reset callbacks got the new size
    want = hora.run(_keras_jobs.reference, (plan, steps), np=1)[0]
    for r in results:
        for got, value in zip(r["weights"], want, strict=True):
            np.testing.assert_allclose(got, value, rtol=0, atol=1e-10)
    err = capfd.readouterr().err
    assert "hora: restarting" not in err, err
    assert "hora: resized in place from 3 to 2 ranks" in err, err


def test_a_keras_run_shrinks_in_place_and_grows_back_in_place(tmp_path, monkeypatch, capfd):
    """np=3, min_np=2, max_np=3: rank 2 SIGKILLs itself mid-epoch; ranks 0 and 1 become a world
    of 2; the local engine has room for 3, so a new rank 2 starts and, at the survivors' next
    commit (held until it waits to join), the three re-form a world of 3 and finish. The new
    rank's optimizer gets the survivors' momentum (it had none: Keras builds it at the first
    step): every rank's optimizer variables are equal, every sample of every epoch is trained
    once, and the weights equal one Keras process trained on the same steps."""
    monkeypatch.setenv("HORA_ELASTIC_SETTLE_SECONDS", "1")
    Path(tmp_path, _jobs.BACK_MARK).touch()  # the local engine's slots are always there
    # batches of 6, a commit every 2 steps, the kill after the first: 36 samples done at 3
    # ranks, 24 at 2, and the 36 left of the epoch deal evenly to 3 ranks
    plan = _jobs.Plan(
        str(tmp_path),
        full=3,
        epochs=2,
        samples=SAMPLES,
        batch=6,
        fault="self",
        fault_commit=1,
        wait_for_return=True,
    )
    results = hora.run(_keras_jobs.train, (plan,), np=3, min_np=2, max_np=3, timeout=300)
    steps, worlds, starts = _jobs.kept_steps(str(tmp_path))
    logs = _jobs.read_logs(str(tmp_path))
    # one attempt: its first world, shrunk in place, grown back in place
    assert sorted(logs) == [(0, 0), (0, 1), (0, 2)], sorted(logs)
    assert worlds == [3, 2, 3], worlds
    assert starts[0] == 0 and 0 < starts[1] < starts[2], starts
    pids = {life: {r: e[0]["pid"] for r, e in ranks.items()} for life, ranks in logs.items()}
    survivors = {0: pids[0, 0][0], 1: pids[0, 0][1]}
    assert {r: pids[0, 1][r] for r in (0, 1)} == survivors, pids
    assert {r: pids[0, 2][r] for r in (0, 1)} == survivors, pids
    assert pids[0, 2][2] not in (*survivors.values(), pids[0, 0][2]), pids  # a new process
    assert [r["pid"] for r in results] == [survivors[0], survivors[1], pids[0, 2][2]]
    assert _jobs.samples_per_epoch(steps) == {e: list(range(SAMPLES)) for e in range(plan.epochs)}
    assert [r["world"] for r in results] == [3, 3, 3]
    # the reset callbacks got the new size on every rank, the new one included
    assert logs[0, 1][0][0]["reset_sizes"] == [2]
    assert logs[0, 2][0][0]["reset_sizes"] == [2, 3]
    assert logs[0, 2][2][0]["reset_sizes"] == [3]
    # the new rank took the running ranks' values (epoch, batch, samples) and commit count
    assert {(e[0]["start"], e[0]["epoch"]) for e in logs[0, 2].values()} == {(starts[2], 0)}
    for r in results[1:]:  # the optimizer's variables: momentum and iteration count alike
        for got, value in zip(r["optimizer"], results[0]["optimizer"], strict=True):
            np.testing.assert_array_equal(got, value)
    want = hora.run(_keras_jobs.reference, (plan, steps), np=1)[0]
    for r in results:
        for got, value in zip(r["weights"], want, strict=True):
            np.testing.assert_allclose(got, value, rtol=0, atol=1e-10)
    err = capfd.readouterr().err
    assert "hora: restarting" not in err and "hora: resizing from" not in err, err
    assert "hora: resized in place from 3 to 2 ranks" in err, err
    assert (
        "hora: growing in place from 2 to 3 ranks (free slots for 3 ranks): starting rank 2; "
        "the running ranks keep their processes"
    ) in err, err
    assert re.search(
        r"hora: resized in place from 2 to 3 ranks in [0-9.]+ s \(free slots for 3 ranks\); "
        rf"the ranks went on from commit {starts[2]}",
        err,
    ), err


def test_a_tensorflow_state_grows_in_place(monkeypatch, capfd):
    """np=1, max_np=2: the local engine has room for 2, so a new rank joins the running one in
    place at a commit; its tf.Variable (started at its own value) and plain values become rank
    0's, and both ranks train on alike."""
    monkeypatch.setenv("HORA_ELASTIC_SETTLE_SECONDS", "1")
    results = hora.run(_keras_jobs.variables, (3,), np=1, min_np=1, max_np=2, timeout=240)
    first, new = results
    assert [r["world"] for r in results] == [2, 2], results
    assert first["pid"] != new["pid"]
    assert [s["world"] for s in first["starts"]] == [1, 2], first["starts"]
    joined = new["starts"]
    assert len(joined) == 1 and joined[0]["world"] == 2 and joined[0]["step"] > 0, joined
    # rank 0's value when the new rank joined (1 + what the world of 1 added), not 1001
    assert joined[0]["value"] == [1.0 + joined[0]["step"]] * 3, joined
    assert first["starts"][1] == joined[0], (first["starts"], joined)
    for r in results:
        assert r["value"] == [1.0 + first["added"]] * 3, r
        assert (r["step"], r["added"]) == (first["step"], first["added"]), r
    err = capfd.readouterr().err
    assert "hora: restarting" not in err and "hora: resizing from" not in err, err
    assert "hora: resized in place from 1 to 2 ranks" in err, err
