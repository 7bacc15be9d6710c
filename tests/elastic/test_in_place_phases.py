"""A rank lost in every phase of an elastic run's world on the local engine is survived in place:
while a new rank starts to grow the world, once the running ranks were told to re-form with it,
a running rank while a new one starts, rank 0 and a second rank at once. Each kill is timed by
the job's own marks (tests/elastic/_jobs.py), never by sleeps; each run checks that no rank
restarted (one attempt), that the survivors kept their processes, that every sample of every
epoch was trained exactly once in the final model, and that the weights equal one process's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import hora
from tests.elastic import _jobs

SAMPLES = 96


def test_a_rank_lost_before_the_first_world_gathered_leaves_its_survivors_a_smaller_one(
    tmp_path, monkeypatch, capfd
):
    """np=3: rank 2 SIGKILLs itself before its hvd.init(); ranks 0 and 1, waiting at the first
    world's rendezvous, hear of a world of 2 there and gather it (nobody restarts); then the run
    grows back to 3 in place."""
    results, worlds = _run(tmp_path, monkeypatch, 3, fault=None, start_fault=True)
    assert worlds in ([2, 3], [2]), worlds  # the first world of 3 never trained
    _jobs.check_survivors(str(tmp_path), results, worlds)
    err = capfd.readouterr().err
    assert "hora: resizing in place from 3 to 2 ranks (rank 2 failed: killed by signal 9" in err
    assert "restarting" not in err and "attempt 1 of" not in err, err


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, np: int, **faults: Any) -> tuple:
    monkeypatch.setenv("HORA_ELASTIC_SETTLE_SECONDS", "1")
    Path(tmp_path, _jobs.BACK_MARK).touch()  # the local engine's slots are always there
    plan = _jobs.Plan(
        str(tmp_path),
        full=np,
        samples=SAMPLES,
        commit_every=3,
        fault_commit=1,
        wait_for_return=True,
        **({"fault": "self"} | faults),
    )
    results = hora.run(_jobs.train, (plan,), np=np, min_np=2, timeout=240, max_restarts=0)
    _steps, worlds = _jobs.check_trained_once(plan, results, atol=1e-10)
    return results, worlds


def test_a_new_rank_lost_before_it_waits_gives_the_growth_up_and_a_later_one_joins(
    tmp_path, monkeypatch, capfd
):
    """np=3: rank 2 is killed, the two survivors re-form; the first rank started to grow back
    SIGKILLs itself before init: the growth is given up (the running ranks never heard of it),
    the next one starts another rank, which joins."""
    results, worlds = _run(tmp_path, monkeypatch, 3, joiner_fault="before")
    assert worlds == [3, 2, 3], worlds
    _jobs.check_survivors(str(tmp_path), results, worlds)
    err = capfd.readouterr().err
    assert "hora: giving up the growth in place (lost during the growth: rank 2 failed" in err, err
    assert "restarting" not in err and "attempt 1 of" not in err, err


def test_a_new_rank_lost_once_the_running_ranks_were_told_re_forms_them_without_it(
    tmp_path, monkeypatch, capfd
):
    """The first new rank SIGKILLs itself once its init returned: the running ranks, re-forming
    with it at their commit, fail to sync; the driver re-forms them alone, then grows again."""
    results, worlds = _run(tmp_path, monkeypatch, 3, joiner_fault="after_init")
    assert worlds[0] == 3 and worlds[-1] == 3 and set(worlds[1:-1]) == {2}, worlds
    _jobs.check_survivors(str(tmp_path), results, worlds)
    err = capfd.readouterr().err
    assert "hora: giving up the growth in place" in err, err
    assert "hora: resizing in place at 2 ranks" in err, err
    assert "restarting" not in err and "attempt 1 of" not in err, err


def test_rank_0_lost_while_a_new_rank_starts_shrinks_without_it_and_grows_back(
    tmp_path, monkeypatch, capfd
):
    """np=4: rank 3 is killed (4 -> 3); while the first new rank starts, rank 0 (holding its
    commit until the run grows) SIGKILLs itself: the new rank is given up and ranks 1 and 2
    re-form as ranks 0 and 1 (3 -> 2), in their processes, and train on (a new growth may
    finish before the run does)."""
    results, worlds = _run(tmp_path, monkeypatch, 4, joiner_fault="running")
    assert worlds[:3] == [4, 3, 2] and worlds[3:] in ([], [4]), worlds
    logs = _jobs.read_logs(str(tmp_path))
    pids = [{r: e[0]["pid"] for r, e in logs[life].items()} for life in sorted(logs)]
    for world in pids[2:]:
        assert [world[0], world[1]] == [pids[1][1], pids[1][2]], pids
    assert [r["pid"] for r in results] == [pids[-1][r] for r in range(worlds[-1])]
    err = capfd.readouterr().err
    assert "hora: giving up the growth in place (lost during the growth: rank 0 failed" in err
    assert "hora: resizing in place from 3 to 2 ranks" in err, err
    assert "restarting" not in err and "attempt 1 of" not in err, err


def test_rank_0_lost_while_a_new_rank_starts_leaves_one_survivor_that_re_forms_with_it(
    tmp_path, monkeypatch, capfd
):
    """np=3, min_np=2: rank 2 is killed (3 -> 2); while the new rank 2 starts, rank 0 SIGKILLs
    itself: 1 survivor < min_np, but with the new rank 2 >= min_np, so rank 1 and the new rank
    re-form a world of 2 from rank 1's last commit (issue 47: this restarted every rank); rank 1
    keeps its process and becomes rank 0."""
    results, worlds = _run(tmp_path, monkeypatch, 3, joiner_fault="running")
    assert worlds[:3] == [3, 2, 2] and worlds[3:] in ([], [3]), worlds
    logs = _jobs.read_logs(str(tmp_path))
    pids = [{r: e[0]["pid"] for r, e in logs[life].items()} for life in sorted(logs)]
    assert pids[1] == {0: pids[0][0], 1: pids[0][1]}, pids
    assert pids[2][0] == pids[0][1] and pids[2][1] not in pids[0].values(), pids
    assert [r["pid"] for r in results][:2] == [pids[2][0], pids[2][1]]
    err = capfd.readouterr().err
    assert "the survivors re-form with the new ranks" in err, err
    assert "giving up the growth" not in err, err
    assert "restarting" not in err and "attempt 1 of" not in err, err


def test_a_rank_lost_before_its_run_said_it_can_re_form_leaves_the_others_in_place(
    tmp_path, monkeypatch, capfd
):
    """np=3: rank 2 SIGKILLs itself in its hvd.elastic.run before it says it can re-form, once
    ranks 0 and 1 said so and started their loops: the world was still starting, but every
    survivor is in its loop, so they re-form a world of 2 in place (issue 47: this restarted
    every rank); the run grows back to 3."""
    results, worlds = _run(tmp_path, monkeypatch, 3, fault=None, run_fault=True)
    assert worlds[:2] == [2, 2] and worlds[2:] in ([], [3]), worlds  # rank 2 never logged
    _jobs.check_survivors(str(tmp_path), results, worlds)
    err = capfd.readouterr().err
    assert "hora: resizing in place from 3 to 2 ranks (rank 2 failed: killed by signal 9" in err
    assert "restarting" not in err and "attempt 1 of" not in err, err


def test_a_rank_lost_past_the_presence_barrier_releases_the_others_from_torchs_rendezvous(
    tmp_path, monkeypatch, capfd
):
    """np=4: rank 3 is killed (4 -> 3); in the world of 3, rank 2 passes the presence barrier
    and SIGKILLs itself before torch's own rendezvous, where ranks 0 and 1 wait for its address:
    they re-form a world of 2 on the driver's word, not once gloo's wait runs out (120 s here),
    in their processes, and the run grows back to 4."""
    monkeypatch.setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "120")
    results, worlds = _run(tmp_path, monkeypatch, 4, window_fault="rendezvous")
    assert worlds[:2] == [4, 2] and worlds[2:] in ([], [4]), worlds  # 3 never trained
    _jobs.check_survivors(str(tmp_path), results, worlds)
    killed = float(Path(tmp_path, _jobs.WINDOW_KILLED_MARK).read_text())
    in_two = min(entries[0]["at"] for entries in _jobs.read_logs(str(tmp_path))[0, 2].values())
    assert in_two - killed < 60, in_two - killed  # released by the driver, not by gloo's wait
    err = capfd.readouterr().err
    assert "hora: resizing in place from 3 to 2 ranks (rank 2 failed: killed by signal 9" in err
    assert "restarting" not in err and "attempt 1 of" not in err, err


def test_a_rank_lost_before_it_joins_the_negotiation_tree_releases_its_parent(
    tmp_path, monkeypatch, capfd
):
    """np=4: rank 3 is killed (4 -> 3); in the world of 3, rank 2 SIGKILLs itself past torch's
    rendezvous, before it connects to its parent in the negotiation tree (rank 0), which waits
    for it there: rank 0 gives way on the driver's word for a world of 2, not at its timeout."""
    monkeypatch.setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "120")
    results, worlds = _run(tmp_path, monkeypatch, 4, window_fault="tree")
    assert worlds[:2] == [4, 2] and worlds[2:] in ([], [4]), worlds
    _jobs.check_survivors(str(tmp_path), results, worlds)
    killed = float(Path(tmp_path, _jobs.WINDOW_KILLED_MARK).read_text())
    in_two = min(entries[0]["at"] for entries in _jobs.read_logs(str(tmp_path))[0, 2].values())
    assert in_two - killed < 60, in_two - killed  # released by the driver, not by the timeout
    err = capfd.readouterr().err
    assert "hora: resizing in place from 3 to 2 ranks (rank 2 failed: killed by signal 9" in err


def test_rank_0_and_another_rank_lost_at_once_re_form_in_place(tmp_path, monkeypatch, capfd):
    """np=4: ranks 0 and 2 SIGKILL themselves at the same step: ranks 1 and 3 become ranks 0
    and 1 of a world of 2, in their processes, and the run grows back to 4."""
    results, worlds = _run(tmp_path, monkeypatch, 4, fault_ranks=(0, 2))
    assert worlds == [4, 2, 4], worlds
    logs = _jobs.read_logs(str(tmp_path))
    pids = [{r: e[0]["pid"] for r, e in logs[life].items()} for life in sorted(logs)]
    assert [pids[1][0], pids[1][1]] == [pids[0][1], pids[0][3]], pids  # order kept
    assert [pids[2][0], pids[2][1]] == [pids[0][1], pids[0][3]], pids
    assert [r["pid"] for r in results][:2] == [pids[0][1], pids[0][3]]
    err = capfd.readouterr().err
    assert "hora: resizing in place from 4 to 2 ranks" in err, err
    assert "restarting" not in err and "attempt 1 of" not in err, err


def test_a_rank_lost_after_the_last_commit_leaves_the_others_to_finish_in_place(
    tmp_path, monkeypatch, capfd
):
    """np=3, no growth back (max_np=3 and the run is over): rank 2 SIGKILLs itself after the
    run's last commit, before its hvd.elastic.run returns; the others, agreeing that every rank
    returned, fail to and re-form as 2 from that commit: nothing left to train, they return (a
    restart would have found the commits removed, and trained the run again from its start)."""
    results, worlds = _run(tmp_path, monkeypatch, 3, fault=None, end_fault=True)
    assert worlds[0] == 3 and len(results) in (2, 3), (worlds, len(results))
    err = capfd.readouterr().err
    assert "hora: resizing in place from 3 to 2 ranks (rank 2 failed: killed by signal 9" in err
    assert "restarting" not in err and "attempt 1 of" not in err, err
