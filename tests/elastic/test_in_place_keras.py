"""A lost rank of a Keras elastic run on the local engine: the survivors re-form the world in
place, as torch's do, and `fit` traces its function again in the new world (the size baked into
the first trace would otherwise still scale the gradients). Then the run grows back in place: a
new rank, whose optimizer has no variables yet, takes the running ranks' weights, momentum and
values by broadcast. A TensorFlowState of plain tf.Variables grows in place too."""

from __future__ import annotations

import pytest

import hora
from tests.elastic import _jobs, _keras_checks, _keras_jobs

pytestmark = pytest.mark.tensorflow


def test_a_killed_rank_s_keras_survivors_train_on_in_place(tmp_path, monkeypatch, capfd):
    """np=3, min_np=2: rank 2 SIGKILLs itself mid-epoch; ranks 0 and 1 keep their processes,
    become a world of 2 and finish. Every sample of every epoch is trained exactly once in the
    final model, which equals one Keras process trained on the same steps."""
    monkeypatch.setenv("HORA_ELASTIC_SETTLE_SECONDS", "600")  # no growth (by a restart) here
    plan = _keras_checks.shrinking(tmp_path, "self")
    results = hora.run(_keras_jobs.train, (plan,), np=3, min_np=2, timeout=300)
    _keras_checks.check_shrunk(plan, results, capfd.readouterr().err)


def test_a_keras_run_shrinks_in_place_and_grows_back_in_place(tmp_path, monkeypatch, capfd):
    """np=3, min_np=2, max_np=3: rank 2 SIGKILLs itself mid-epoch; ranks 0 and 1 become a world
    of 2; the local engine has room for 3, so a new rank 2 starts and, at the survivors' next
    commit (held until it waits to join), the three re-form a world of 3 and finish. The new
    rank's optimizer gets the survivors' momentum (it had none: Keras builds it at the first
    step): every rank's optimizer variables are equal, every sample of every epoch is trained
    once, and the weights equal one Keras process trained on the same steps."""
    monkeypatch.setenv("HORA_ELASTIC_SETTLE_SECONDS", "1")
    plan = _keras_checks.shrinking_and_growing(tmp_path, "self")
    results = hora.run(_keras_jobs.train, (plan,), np=3, min_np=2, max_np=3, timeout=300)
    err = capfd.readouterr().err
    went_on = _keras_checks.check_shrunk_and_grown(plan, results, err)
    _jobs.check_grew_in_place(err, 2, 3, went_on)


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
