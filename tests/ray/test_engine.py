"""The Ray engine on a real local Ray head: results, logs, failures, timeouts, actor loss, leaks."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hora
from tests import _driver_death, _workers
from tests.elastic import _jobs as _elastic
from tests.ray import _jobs
from tests.ray.conftest import live_actors, live_placement_groups, ray, start_ray, stop_ray

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module", autouse=True)
def ray_head():
    context = start_ray(num_cpus=4)
    yield context
    stop_ray()


def test_run_auto_uses_ray_returns_every_rank_and_relays_logs(capfd):
    """`auto` after ray.init(), the contract as on the other engines, logs marked rank@host."""
    found = hora.run(_jobs.place, np=2, env={"USER_VAR": "mine"})  # backend="auto"
    assert [f["RANK"] for f in found] == ["0", "1"]
    assert [f["LOCAL_RANK"] for f in found] == ["0", "1"]
    assert {f["WORLD_SIZE"] for f in found} == {"2"}
    assert {f["MASTER_ADDR"] for f in found} == {"127.0.0.1"}  # one machine: loopback
    assert {f["USER_VAR"] for f in found} == {"mine"}
    assert {f["OMP_NUM_THREADS"] for f in found} == {"1"}  # the bundle's one CPU
    assert all("RankSupervisor" in f["parent"] for f in found), found  # each under its actor
    out, _ = capfd.readouterr()
    for rank in (0, 1):  # rank@host: a cluster engine's mark, the host as the rank names it
        assert f"[{rank}@{socket.gethostname()}] hello from rank {rank}" in out, out


def test_runner_np_positive_and_gloo_on_ray():
    """HorovodRunner's np > 0 goes to the cluster the program started: Ray, with no Spark."""
    assert hora.Runner(np=2).run(_workers.gloo_allreduce) == 3.0
    options = {"placement_strategy": "spread", "num_cpus_per_rank": 2}
    assert hora.run(_workers.rank_times, (5,), np=2, backend="ray", engine_options=options) == [
        0,
        5,
    ]


def test_a_failing_rank_fails_the_job_with_its_story():
    with pytest.raises(hora.WorkerFailedError) as info:
        hora.run(_workers.fail_on, (1, "raise"), np=2, backend="ray")
    message = str(info.value)
    assert message.startswith("rank 1 failed: ValueError: deliberate failure"), message
    assert "in fail_on" in message and "rank 1 about to fail" in message


def test_timeout_stops_every_rank():
    with pytest.raises(hora.RunTimeoutError, match=r"timeout=4 s"):
        hora.run(_workers.hang, np=2, backend="ray", timeout=4)


def test_killed_actor_fails_the_attempt_and_max_restarts_runs_it_again(capfd):
    """An actor SIGKILLed mid-job (as a lost node) is the attempt's story; the restart (a new
    placement group and new actors) finishes the job, and the orphaned rank was stopped."""
    results = hora.run(
        _jobs.kill_own_actor_on_first_attempt, (1,), np=2, backend="ray", max_restarts=1
    )
    assert results == ["attempt 1 done", "attempt 1 done"]
    _, err = capfd.readouterr()
    assert "attempt 1 of 2 failed: the Ray actor of rank 1 failed: its Ray actor died" in err


def test_killed_actor_without_restarts_fails_with_the_story():
    with pytest.raises(hora.WorkerFailedError) as info:
        hora.run(_jobs.kill_own_actor_on_first_attempt, (0,), np=2, backend="ray")
    assert str(info.value).startswith("the Ray actor of rank 0 failed: its Ray actor died")


def test_an_elastic_run_re_forms_in_place_around_a_killed_actor_and_grows_back(
    tmp_path, monkeypatch, capfd
):
    """np=3, min_np=2 under hvd.elastic.run: rank 2 SIGKILLs its own actor mid-epoch and lives
    on, an orphan; hora closes its channel (it dies, else the others would wait for it for
    ever), ranks 0 and 1 keep their actors and processes and become a world of 2. The lost
    actor's bundle is still the placement group's: after the settle time a new actor in it
    starts a new rank 2, and at the survivors' next commit (held until it waits to join) the
    three re-form a world of 3 and finish. Every sample of every epoch is trained once in the
    final model, which equals one process trained on the same steps."""
    monkeypatch.setenv("HORA_ELASTIC_SETTLE_SECONDS", "1")
    Path(tmp_path, _elastic.BACK_MARK).touch()  # the bundle is there as soon as the actor died
    # as tests/elastic/test_in_place.py: 36 samples at 3 ranks, 24 at 2, 36 left for 3
    plan = _elastic.Plan(
        str(tmp_path),
        full=3,
        samples=96,
        commit_every=3,
        fault="actor",
        fault_commit=1,
        wait_for_return=True,
    )
    results = hora.run(_elastic.train, (plan,), np=3, min_np=2, backend="ray", timeout=240)
    _, _, starts = _elastic.kept_steps(str(tmp_path))
    # one attempt: its first world, shrunk in place, grown back in place
    _elastic.check_in_place(str(tmp_path), results, small=2)
    _, worlds = _elastic.check_trained_once(plan, results, atol=1e-10)
    assert worlds == [3, 2, 3], worlds
    _, err = capfd.readouterr()
    assert "hora: restarting" not in err and "attempt 1 of" not in err, err
    assert re.search(
        r"hora: resized in place from 3 to 2 ranks in [0-9.]+ s \(the Ray actor of rank 2 "
        rf"failed: its Ray actor died .*\); the ranks went on from commit {starts[1]}",
        err,
    ), err
    assert (
        "hora: growing in place from 2 to 3 ranks (free slots for 3 ranks): starting rank 2" in err
    )
    assert re.search(
        r"hora: resized in place from 2 to 3 ranks in [0-9.]+ s \(free slots for 3 ranks\); "
        rf"the ranks went on from commit {starts[2]}",
        err,
    ), err


def test_bad_options_and_too_few_resources_fail_before_anything_starts():
    with pytest.raises(ValueError, match="placement_strategy must be one of"):
        hora.run(
            _workers.rank_times,
            (1,),
            np=2,
            backend="ray",
            engine_options={"placement_strategy": "ANYWHERE"},
        )
    with pytest.raises(ValueError, match="not options of the 'ray' engine"):
        hora.run(_workers.rank_times, (1,), np=2, backend="ray", engine_options={"gpus": 1})
    with pytest.raises(ValueError, match=r"np=9 needs more than this Ray cluster has"):
        hora.run(_workers.rank_times, (1,), np=9, backend="ray")


def test_a_placement_the_cluster_cannot_make_times_out_and_is_removed():
    """STRICT_SPREAD on one node never places: start_timeout says so, nothing stays reserved."""
    with pytest.raises(hora.RunTimeoutError, match="did not start within start_timeout=3 s"):
        hora.run(
            _workers.rank_times,
            (1,),
            np=2,
            backend="ray",
            start_timeout=3,
            engine_options={"placement_strategy": "STRICT_SPREAD"},
        )


def test_twenty_runs_leak_no_actor_placement_group_process_or_fd():
    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    hora.run(_workers.rank_times, (1,), np=2, backend="ray")  # Ray's own connections warm up
    before = fds()
    for i in range(20):
        assert hora.run(_workers.rank_times, (i,), np=2, backend="ray") == [0, i]
        assert not live_actors() and not live_placement_groups()
    assert fds() <= before + 2, (before, fds())


def test_cli_runs_a_script_on_the_cluster_at_ray_address(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys
            import torch, torch.distributed as dist
            dist.init_process_group("gloo")
            t = torch.ones(1) * (dist.get_rank() + 1)
            dist.all_reduce(t)
            print("rank", dist.get_rank(), "sum", t.item(), sys.argv[1:])
            """
        )
    )
    env = dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hora",
            "run",
            "-np",
            "2",
            "--backend",
            "ray",
            str(script),
            "--lr",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        assert f"rank {rank} sum 3.0 ['--lr', '1']" in done.stdout


def test_a_killed_drivers_ranks_actors_and_placement_group_are_gone(tmp_path):
    """A driver of its own, connected to this head (which outlives it), runs 2 ranks and is
    SIGKILLed: the ranks (and the child each started) are gone within seconds, and Ray ends the
    job's actors (their processes too) and removes its placement group: every CPU is free."""
    cpus = ray.cluster_resources()["CPU"]
    address = ray.get_runtime_context().gcs_address
    driver = _driver_death.start_driver(tmp_path, "ray", str(tmp_path), address)
    try:
        ranks = _driver_death.wait_for_ranks(driver, np=2)
        actors = _driver_death.running({r["parent"] for r in ranks})  # RankSupervisor's
        assert len(actors) == 2 and len(live_actors()) == 2, (ranks, live_actors())
        assert len(live_placement_groups()) == 1, live_placement_groups()
        assert all(r["shm"] for r in ranks), ranks  # one node: they met in shared memory

        def held() -> list:
            free = ray.available_resources().get("CPU", 0)
            cpu = [f"{cpus - free} CPUs"] if free < cpus else []
            return (
                _driver_death.still_running(actors) + live_actors() + live_placement_groups() + cpu
            )

        took = _driver_death.kill_and_time(
            driver, [p for r in ranks for p in (r["pid"], r["child"])]
        )
        rest, left = _driver_death.wait_until_gone(held, 30)
        stray = driver.tagged()
    finally:
        driver.stop()
    print(
        f"ray: the ranks and their children gone {took:.2f} s after the driver was killed, the "
        f"actors, their processes and the placement group {took + rest:.2f} s after"
    )
    assert not left, left
    assert not stray
    assert not _driver_death.segments_left(ranks)
