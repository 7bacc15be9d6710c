"""A lost Ray actor of a Keras elastic run: the survivors re-form the world in place, as on the
local engine (tests/elastic/test_in_place_keras.py), keeping their actors and processes; then
a new actor in the lost one's bundle joins them in place."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import hora
from tests.elastic import _jobs, _keras_jobs
from tests.ray.conftest import start_ray, stop_ray

pytestmark = pytest.mark.ray

SAMPLES = 96


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
    plan = _jobs.Plan(
        str(tmp_path), full=3, epochs=2, samples=SAMPLES, fault="actor", fault_commit=2
    )
    results = hora.run(_keras_jobs.train, (plan,), np=3, min_np=2, backend="ray", timeout=300)
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
    want = hora.run(_keras_jobs.reference, (plan, steps), np=1, backend="local")[0]
    for r in results:
        for got, value in zip(r["weights"], want, strict=True):
            np.testing.assert_allclose(got, value, rtol=0, atol=1e-10)
    err = capfd.readouterr().err
    assert "hora: restarting" not in err, err
    assert "hora: resized in place from 3 to 2 ranks" in err, err
    assert "the Ray actor of rank 2 failed" in err, err


def test_a_killed_actor_s_keras_survivors_grow_back_in_place(tmp_path, monkeypatch, capfd):
    """np=3, min_np=2: as above, then the lost actor's bundle (still the placement group's)
    runs a new rank 2, whose fresh optimizer takes the survivors' momentum at the survivors'
    next commit; the three finish with the weights of one Keras process on the same steps."""
    monkeypatch.setenv("HORA_ELASTIC_SETTLE_SECONDS", "1")
    Path(tmp_path, _jobs.BACK_MARK).touch()  # the bundle is there as soon as the actor died
    # as tests/elastic/test_in_place_keras.py: 36 samples at 3 ranks, 24 at 2, 36 left for 3
    plan = _jobs.Plan(
        str(tmp_path),
        full=3,
        epochs=2,
        samples=SAMPLES,
        batch=6,
        fault="actor",
        fault_commit=1,
        wait_for_return=True,
    )
    results = hora.run(_keras_jobs.train, (plan,), np=3, min_np=2, backend="ray", timeout=300)
    steps, worlds, _ = _jobs.kept_steps(str(tmp_path))
    logs = _jobs.read_logs(str(tmp_path))
    assert sorted(logs) == [(0, 0), (0, 1), (0, 2)], sorted(logs)
    assert worlds == [3, 2, 3], worlds
    pids = {life: {r: e[0]["pid"] for r, e in ranks.items()} for life, ranks in logs.items()}
    survivors = [pids[0, 0][0], pids[0, 0][1]]
    assert [pids[0, 2][r] for r in (0, 1)] == survivors, pids
    assert [r["pid"] for r in results] == [*survivors, pids[0, 2][2]]
    assert pids[0, 2][2] not in (*survivors, pids[0, 0][2]), pids  # a new process
    assert _jobs.samples_per_epoch(steps) == {e: list(range(SAMPLES)) for e in range(plan.epochs)}
    for r in results[1:]:
        for got, value in zip(r["optimizer"], results[0]["optimizer"], strict=True):
            np.testing.assert_array_equal(got, value)
    want = hora.run(_keras_jobs.reference, (plan, steps), np=1, backend="local")[0]
    for r in results:
        for got, value in zip(r["weights"], want, strict=True):
            np.testing.assert_allclose(got, value, rtol=0, atol=1e-10)
    err = capfd.readouterr().err
    assert "hora: restarting" not in err and "attempt 1 of" not in err, err
    assert "hora: resized in place from 3 to 2 ranks" in err, err
    assert "hora: resized in place from 2 to 3 ranks" in err, err
