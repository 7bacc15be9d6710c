"""A lost Ray actor of a Keras elastic run: the survivors re-form the world in place, as on the
local engine (tests/elastic/test_in_place_keras.py), keeping their actors and processes; then
a new actor in the lost one's bundle joins them in place."""

from __future__ import annotations

import pytest

import hora
from tests.elastic import _keras_checks, _keras_jobs
from tests.ray.conftest import start_ray, stop_ray

pytestmark = [pytest.mark.ray, pytest.mark.tensorflow]


@pytest.fixture(scope="module", autouse=True)
def ray_head():
    context = start_ray(num_cpus=4)
    yield context
    stop_ray()


def test_a_killed_actor_s_keras_survivors_train_on_in_place(tmp_path, monkeypatch, capfd):
    """np=3, min_np=2: rank 2 SIGKILLs its actor mid-epoch (and is stopped by hora, an
    orphan); ranks 0 and 1 keep their actors and processes, become a world of 2 and finish (no
    growth within the settle time). Every sample of every epoch is trained exactly
    once in the final model, which equals one Keras process trained on the same steps."""
    monkeypatch.setenv("HORA_ELASTIC_SETTLE_SECONDS", "600")  # no growth (by a restart) here
    plan = _keras_checks.shrinking(tmp_path, "actor")
    results = hora.run(_keras_jobs.train, (plan,), np=3, min_np=2, backend="ray", timeout=300)
    err = capfd.readouterr().err
    _keras_checks.check_shrunk(plan, results, err)
    assert "the Ray actor of rank 2 failed" in err, err


def test_a_killed_actor_s_keras_survivors_grow_back_in_place(tmp_path, monkeypatch, capfd):
    """np=3, min_np=2: as above, then the lost actor's bundle (still the placement group's)
    runs a new rank 2, whose fresh optimizer takes the survivors' momentum at the survivors'
    next commit; the three finish with the weights of one Keras process on the same steps."""
    monkeypatch.setenv("HORA_ELASTIC_SETTLE_SECONDS", "1")
    plan = _keras_checks.shrinking_and_growing(tmp_path, "actor")
    results = hora.run(_keras_jobs.train, (plan,), np=3, min_np=2, backend="ray", timeout=300)
    err = capfd.readouterr().err
    _keras_checks.check_shrunk_and_grown(plan, results, err)
    assert "hora: resized in place from 2 to 3 ranks" in err, err
