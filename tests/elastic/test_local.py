"""An elastic run on real local processes: it grows at a commit, and a killed rank's run resumes
from the last commit that the ranks kept on the host (in-memory commits only, no checkpoint)."""

from __future__ import annotations

import re

import torch

import hora
from tests.elastic import _jobs

SAMPLES = 96


def test_a_local_run_grows_at_a_commit_and_resumes_a_killed_rank_from_its_last_commit(
    tmp_path, monkeypatch, capfd
):
    """np=1, max_np=2: the local engine can always start 2, so the run grows to 2 at a commit;
    then the last rank SIGKILLs itself and the run restarts (2 ranks again: this machine's
    capacity) from the commit before (in-place recovery turned off: this is the restart path,
    as jobs without hvd.elastic.run take). Every sample of every epoch is trained exactly once
    in the final model, which equals one process trained on the same steps."""
    monkeypatch.setenv("HORA_ELASTIC_SETTLE_SECONDS", "1")
    monkeypatch.setenv("HORA_ELASTIC_IN_PLACE", "0")
    plan = _jobs.Plan(
        str(tmp_path), full=2, samples=SAMPLES, fault="self", fault_attempt=1, fault_commit=2
    )
    results = hora.run(_jobs.train, (plan,), np=1, min_np=1, max_np=2, timeout=240)
    steps, worlds, starts = _jobs.kept_steps(str(tmp_path))
    assert worlds == [1, 2, 2], worlds
    assert starts[0] == 0 and 0 < starts[1] < starts[2], starts
    assert _jobs.samples_per_epoch(steps) == {e: list(range(SAMPLES)) for e in range(plan.epochs)}
    want = _jobs.reference(plan, steps)
    assert [r["world"] for r in results] == [2, 2]
    for r in results:
        for key, value in want.items():
            torch.testing.assert_close(r["weights"][key], value, rtol=0, atol=1e-10)
    resets = {
        a: e[0]["reset_sizes"]
        for a, e in _jobs.read_logs(str(tmp_path)).items()
        for r, e in e.items()
        if r == 0
    }
    # called with the new size, on a change
    assert resets == {(0, 0): [], (1, 0): [2], (2, 0): []}, resets
    err = capfd.readouterr().err
    assert re.search(
        r"hora: resizing from 1 to 2 ranks \(free slots for 2 ranks; every rank "
        rf"stopped at commit {starts[1]}\)",
        err,
    ), err
    assert "hora: restarting 2 ranks (rank 1 failed: killed by signal 9 (SIGKILL))" in err, err
    assert f"hora: the ranks resumed from commit {starts[2]} (made by 2 ranks)" in err, err
