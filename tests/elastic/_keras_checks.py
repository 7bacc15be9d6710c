"""What a Keras elastic run that re-formed in place must show, on any engine (the local one in
tests/elastic/test_in_place_keras.py, Ray in tests/ray/test_in_place_keras.py): the plans
that shrink it (and grow it back), and the checks of its logs and results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import hora
from tests.elastic import _jobs, _keras_jobs

SAMPLES = 96


def shrinking(folder: Path, fault: str) -> _jobs.Plan:
    """np=3: rank 2 (`fault`: "self" or "actor") is killed after the second commit."""
    return _jobs.Plan(str(folder), full=3, epochs=2, samples=SAMPLES, fault=fault, fault_commit=2)


def shrinking_and_growing(folder: Path, fault: str) -> _jobs.Plan:
    """As `shrinking`, then back at 3 where the engine has room (BACK_MARK is there). Batches
    of 6, a commit every 2 steps, the kill after the first: 36 samples done at 3 ranks, 24 at
    2, and the 36 left of the epoch deal evenly to 3 ranks."""
    Path(folder, _jobs.BACK_MARK).touch()
    return _jobs.Plan(
        str(folder),
        full=3,
        epochs=2,
        samples=SAMPLES,
        batch=6,
        fault=fault,
        fault_commit=1,
        wait_for_return=True,
    )


def check_shrunk(plan: _jobs.Plan, results: list[dict[str, Any]], err: str) -> None:
    """Ranks 0 and 1 kept their processes and finished as a world of 2; every sample of every
    epoch once; the weights one Keras process's on the same steps."""
    steps, worlds, starts = _jobs.kept_steps(plan.folder)
    logs = _jobs.read_logs(plan.folder)
    assert sorted(logs) == [(0, 0), (0, 1)], sorted(logs)  # one attempt, re-formed once
    assert worlds == [3, 2], worlds
    assert starts[0] == 0 and starts[1] > 0, starts
    first_pids = {r: logs[0, 0][r][0]["pid"] for r in range(3)}
    again_pids = {r: logs[0, 1][r][0]["pid"] for r in range(2)}
    assert again_pids == {0: first_pids[0], 1: first_pids[1]}, (first_pids, again_pids)
    assert sorted(r["pid"] for r in results) == sorted(again_pids.values())
    assert [r["world"] for r in results] == [2, 2]
    assert logs[0, 1][0][0]["reset_sizes"] == [2]  # the reset callbacks got the new size
    _check_trained(plan, results, steps)
    assert "hora: restarting" not in err, err
    assert "hora: resized in place from 3 to 2 ranks" in err, err


def check_shrunk_and_grown(plan: _jobs.Plan, results: list[dict[str, Any]], err: str) -> int:
    """`check_shrunk`'s, then a new process joined as rank 2 with the survivors' state (its
    optimizer's momentum too) and the three finished; returns the commit they went on from."""
    steps, worlds, starts = _jobs.kept_steps(plan.folder)
    # one attempt: its first world, shrunk in place, grown back in place
    logs = _jobs.check_in_place(plan.folder, results, small=2)
    assert worlds == [3, 2, 3], worlds
    assert starts[0] == 0 and 0 < starts[1] < starts[2], starts
    # the reset callbacks got the new size on every rank, the new one included
    assert logs[0, 1][0][0]["reset_sizes"] == [2]
    assert logs[0, 2][0][0]["reset_sizes"] == [2, 3]
    assert logs[0, 2][2][0]["reset_sizes"] == [3]
    # the new rank took the running ranks' values (epoch, batch, samples) and commit count
    assert {(e[0]["start"], e[0]["epoch"]) for e in logs[0, 2].values()} == {(starts[2], 0)}
    for r in results[1:]:  # the optimizer's variables: momentum and iteration count alike
        for got, value in zip(r["optimizer"], results[0]["optimizer"], strict=True):
            np.testing.assert_array_equal(got, value)
    _check_trained(plan, results, steps)
    assert "hora: restarting" not in err and "hora: resizing from" not in err, err
    assert "hora: resized in place from 3 to 2 ranks" in err, err
    return starts[2]


def _check_trained(plan: _jobs.Plan, results: list[dict[str, Any]], steps: list[_jobs.Step]):
    """Every sample of every epoch once; every rank's weights one Keras process's on `steps`
    (in a local process of its own: TensorFlow stays out of the test's)."""
    assert _jobs.samples_per_epoch(steps) == {e: list(range(SAMPLES)) for e in range(plan.epochs)}
    want = hora.run(_keras_jobs.reference, (plan, steps), np=1, backend="local")[0]
    for r in results:
        for got, value in zip(r["weights"], want, strict=True):
            np.testing.assert_allclose(got, value, rtol=0, atol=1e-10)
