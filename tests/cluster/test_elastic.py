"""Elastic runs on 2 namespaced hosts x 2 slots (issue 25's acceptance): one cluster with Spark
standalone and Ray on every host, started once for these few jobs and test_ray.py's.

- Spark, np=4, min_np=2, max_np=4: an MLP (DistributedOptimizer) and the same MLP sharded with
  FSDP2 train side by side under hvd.elastic on samples that `hora.data.from_spark` wrote from a
  DataFrame (its loader's position committed in the TorchState); mid-epoch every process of
  host 2 is killed; the sharded state cannot re-form in place, so the run restarts with 2 ranks
  from the last commit (kept on host 1); host 2 comes back; the run grows to 4 at the next
  commit (the FSDP2 model reloaded from its DCP checkpoint at each new size) and finishes. Every
  row of every epoch is trained once in the final model, which equals one process trained on
  the same steps, and so does the FSDP2 model.
- Spark, a Keras model (hora.tensorflow.keras.elastic's state and callbacks): the same loss and
  return, in place both ways (each rank a Spark job of its own): host 1's ranks keep their
  processes throughout, nothing restarts.
- Ray, np=4, min_np=2, max_np=4, the MLP with its FSDP2 twin (`reshard=`): an actor's node is
  removed (host 2 killed) mid-epoch; host 1's actors and their workers are kept and re-form a
  world of 2 in place (same processes); host 2's node comes back, new actors start in the
  placement group's lost bundles (reserved there again) and the run grows back to 4 in place,
  host 1's ranks still in their processes; every sample of every epoch once, the weights those
  of one process on the same steps.

In place across hosts, each engine and each model kind once: the Keras model on Spark, the
MLP with its resharded FSDP2 twin on Ray. A rank's state re-forms in place the same way under
either engine; what is the engine's (Spark's tasks lost and new ones joining, Ray's actors and
bundles) is in both jobs. The two pairs left out run on one machine: Keras in place on Ray in
tests/ray/test_in_place_keras.py; on Spark, an MLP in place in
tests/spark/test_engine_local.py and the resharded FSDP2 twin (rank-side, the same on every
engine) in tests/elastic/test_in_place.py. The Keras job is `slow` (`make test-slow`; the
suite's budget): in the suite, Spark's ranks re-form in place across the hosts in the two jobs
of a rank lost in a phase (below), and Keras re-forms in place on one machine
(tests/elastic/test_in_place_keras.py) and on Ray.
- A rank lost in a phase of the world (issue 39; tests/elastic/test_in_place_phases.py locally),
  np=4, min_np=2, nothing restarted: on Spark, a new rank lost before it waits (the growth is
  given up, its task ends, a later one joins) and rank 0 lost while a new rank starts; on Ray, a
  rank lost before the first world gathered (the survivors gather a world of 3 in place).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import hora
from tests.cluster._checks import Watcher
from tests.cluster._cluster import Cluster
from tests.cluster.conftest import (
    CORES,
    HOSTS,
    make_whole,
    note,
    timed,
    wait_for_ray_nodes,
)
from tests.elastic import _jobs, _keras_jobs
from tests.ray.conftest import live_actors, live_placement_groups

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.ray]

NP = HOSTS * CORES
JOB_TIMEOUT = 400.0
SETTLE = "2"  # HORA_ELASTIC_SETTLE_SECONDS on the driver: a lost host leaves Spark's count at once


@pytest.fixture(scope="module")
def cluster(spark_and_ray_cluster: Cluster) -> Cluster:
    """Spark standalone and Ray on the same hosts; this process the driver of both (kept for
    test_ray.py)."""
    return spark_and_ray_cluster


@pytest.fixture
def whole(cluster: Cluster, monkeypatch) -> Iterator[Cluster]:
    monkeypatch.setenv("HORA_ELASTIC_SETTLE_SECONDS", SETTLE)
    yield cluster
    make_whole(cluster)


def _marked(folder: Path, name: str):
    def ready() -> str | None:
        mark = folder / name
        return (mark.read_text() or "yes") if mark.exists() else None

    return ready


def _lose_and_bring_back(cluster: Cluster, folder: Path):
    """Watchers: kill the host a rank marks; once the run is small, bring it back."""

    def bring_back(_: str) -> None:
        make_whole(cluster)  # host 2's Spark worker and Ray node again, every slot registered
        (folder / _jobs.BACK_MARK).touch()

    killer = Watcher(_marked(folder, _jobs.HOST_MARK), cluster.kill_host)
    returner = Watcher(_marked(folder, _jobs.SMALL_MARK), bring_back)
    return killer, returner


def _kept_steps(plan: _jobs.Plan) -> tuple[list[_jobs.Step], list[int]]:
    """The steps the final model holds and each attempt's size; every sample of every epoch
    among them once."""
    steps, worlds, starts = _jobs.kept_steps(plan.folder)
    note(f"  worlds {worlds}, attempts resumed from commits {starts}")
    epochs = _jobs.samples_per_epoch(steps)
    assert epochs == {e: list(range(plan.samples)) for e in range(plan.epochs)}
    return steps, worlds


def _shrink_and_grow_on_spark(
    cluster: Cluster,
    folder: Path,
    job: Any,
    what: str,
    capfd: Any,
    shrinks: str = "",
    grows: str = "",
    **options: Any,
) -> tuple[_jobs.Plan, list[dict[str, Any]], list[_jobs.Step]]:
    """`job` on Spark (np=4, min_np=2, max_np=4) loses the host its last rank marks mid-epoch,
    goes on with 2 ranks, and grows back to 4 once the host is back; the driver says so (by a
    restart, or " in place" as `shrinks`/`grows` say)."""
    plan = _jobs.Plan(
        str(folder),
        full=NP,
        fault="host",
        fault_commit=1,
        wait_for_return=True,
        step_seconds=0.05,
        **options,
    )
    killer, returner = _lose_and_bring_back(cluster, folder)
    with killer, returner, timed(f"elastic spark: lose host, shrink, return, grow ({what})"):
        results = hora.run(
            job, (plan,), np=NP, min_np=2, max_np=NP, backend="spark", timeout=JOB_TIMEOUT
        )
    steps, worlds = _kept_steps(plan)
    assert worlds == [NP, 2, NP], worlds
    err = capfd.readouterr().err
    lost = rf"hora: resizing{shrinks} from 4 to 2 ranks \(lost {killer.value}: "
    assert re.search(lost, err), err
    if grows:  # nothing restarted: host 1's ranks kept their processes across both resizes
        assert "hora: restarting" not in err and "hora: resizing from" not in err, err
        _jobs.check_in_place(plan.folder, results, small=2)
        assert re.search(r"hora: resized in place from 2 to 4 ranks in [0-9.]+ s \(free ", err), err
    else:
        grew = r"hora: resizing from 2 to 4 ranks \(free slots for 4 ranks; every rank stopped at "
        assert re.search(grew + r"commit \d+\)", err), err
    return plan, results, steps


def _check_mlp_and_fsdp2(
    plan: _jobs.Plan, results: list[dict[str, Any]], steps: list[_jobs.Step]
) -> None:
    """The MLP and its FSDP2 twin, sharded over the 4 ranks of the end, hold the weights of one
    process trained on the same steps."""
    want = _jobs.reference(plan, steps)
    assert [r["mesh"] for r in results] == [NP] * NP
    for r in results:
        for key, value in want.items():
            torch.testing.assert_close(r["weights"][key], value, rtol=0, atol=1e-9)
            torch.testing.assert_close(r["sharded"][key], value, rtol=0, atol=1e-9)


@pytest.mark.timeout(900)
def test_spark_shrinks_on_a_lost_host_and_grows_back_mlp_and_fsdp2(whole, tmp_path, capfd):
    """The samples are a DataFrame's rows read through hora.data (ids logged per step): the
    loader's remaining rows are split again at 2 ranks and at 4, each row once per epoch."""
    from pyspark.sql import SparkSession

    import hora.data

    df = _jobs.data_frame(SparkSession.builder.getOrCreate(), _jobs.Plan.samples)
    with timed("elastic spark: from_spark of the samples"):
        data = hora.data.from_spark(df, store=str(tmp_path / "store"))
    plan, results, steps = _shrink_and_grow_on_spark(
        whole, tmp_path, _jobs.train, "MLP+FSDP2, hora.data", capfd, fsdp=True, data=data
    )
    _check_mlp_and_fsdp2(plan, results, steps)  # the FSDP2 twin reloaded at every size


@pytest.mark.slow  # the suite's budget (the module's docstring)
@pytest.mark.timeout(900)
def test_spark_shrinks_on_a_lost_host_and_grows_back_keras(whole, tmp_path, capfd):
    """Keras re-forms in place on the lost host (the survivors keep their processes), and grows
    back in place (new tasks take the state by broadcast, optimizer slots included)."""
    plan, results, steps = _shrink_and_grow_on_spark(
        whole, tmp_path, _keras_jobs.train, "Keras", capfd, shrinks=" in place", grows="yes"
    )
    # the one-process Keras reference, in a process of its own (TensorFlow stays out of here)
    want = hora.run(_keras_jobs.reference, (plan, steps), np=1, backend="local")[0]
    for r in results:
        for got, value in zip(r["weights"], want, strict=True):
            assert abs(got - value).max() < 1e-9, (got, value)


def _shrink_and_grow_in_place_on_ray(
    cluster: Cluster, folder: Path, job: Any, what: str, capfd: Any, **options: Any
) -> tuple[_jobs.Plan, list[dict[str, Any]], list[_jobs.Step]]:
    """`job` on Ray (np=4, min_np=2, max_np=4) loses host 2's node (every process on it
    SIGKILLed) mid-epoch: host 1's actors and ranks re-form a world of 2 in place; the node
    comes back, new actors start in the lost bundles, and the run grows back to 4 in place.
    Checked: one attempt, host 1's PIDs kept, the new ranks new processes on host 2, the
    driver's lines, nothing of the job left on Ray."""
    plan = _jobs.Plan(
        str(folder),
        full=NP,
        fault="host",
        fault_commit=1,
        step_seconds=0.05,
        wait_for_return=True,
        **options,
    )
    back: dict[str, float] = {}

    def bring_back(_: str) -> None:
        back["asked"] = time.time()
        cluster.make_whole()  # host 2's services again: its Ray node started
        wait_for_ray_nodes(HOSTS)
        back["alive"] = time.time()
        (folder / _jobs.BACK_MARK).touch()

    with (
        Watcher(_marked(folder, _jobs.HOST_MARK), cluster.kill_host) as killer,
        Watcher(_marked(folder, _jobs.SMALL_MARK), bring_back),
        timed(f"elastic ray: a node removed, re-formed in place, node back, grown ({what})"),
    ):
        results = hora.run(
            job, (plan,), np=NP, min_np=2, max_np=NP, backend="ray", timeout=JOB_TIMEOUT
        )
    assert not live_actors() and not live_placement_groups()
    steps, worlds = _kept_steps(plan)
    assert worlds == [NP, 2, NP], worlds
    logs = _jobs.check_in_place(plan.folder, results, small=2)  # host 1's kept their processes
    hosts = [r["host"] for r in results]
    assert hosts[2] == hosts[3] == killer.value and hosts[0] == hosts[1] != killer.value, hosts
    err = capfd.readouterr().err
    assert "hora: restarting" not in err and "hora: resizing from" not in err, err
    gone = rf"hora: resized in place from 4 to 2 ranks in [0-9.]+ s \(lost {killer.value}: "
    assert re.search(gone + r".*; also lost: rank \d\); the ranks went on from commit", err), err
    assert (
        "hora: growing in place from 2 to 4 ranks (free slots for 4 ranks): starting ranks "
        "2, 3; the running ranks keep their processes" in err
    ), err
    grew = r"hora: resized in place from 2 to 4 ranks in ([0-9.]+) s \(free slots for 4 ranks\)"
    seconds = re.search(grew, err)
    assert seconds, err
    first_at_4 = min(e["t"] for r in range(NP) for e in logs[0, 2][r] if "n" in e)
    note(
        f"  ray grew in place ({what}): host back (its Ray node alive) -> first step at 4 ranks "
        f"{first_at_4 - back['alive']:.2f} s (from the restart of its services "
        f"{first_at_4 - back['asked']:.2f} s; the driver's growth to training on "
        f"{seconds.group(1)} s)"
    )
    return plan, results, steps


@pytest.mark.timeout(600)
def test_ray_re_forms_in_place_when_a_node_is_removed_and_grows_back_mlp_and_fsdp2(
    whole, tmp_path, capfd
):
    """The MLP and its FSDP2 twin (`reshard=`: rebuilt sharded over 2, then over 4, each time
    loading the DCP commit) through a lost node and its return, in place both ways. Every
    sample of every epoch once; both models' weights those of one process on the same steps
    (4, 2, then 4 ranks). Ray may still map the lost bundles to the dead node when the node
    returns: the launcher waits for Ray to let them go before it makes their new actors,
    which would otherwise die at once."""
    plan, results, steps = _shrink_and_grow_in_place_on_ray(
        whole, tmp_path, _jobs.train, "MLP+FSDP2", capfd, fsdp=True, reshard=True
    )
    _check_mlp_and_fsdp2(plan, results, steps)


# ----- a rank lost in each phase of the world (issue 39): survived in place, on both engines --
def _lost_in_a_phase(
    folder: Path, backend: str, capfd: Any, **faults: Any
) -> tuple[list[dict[str, Any]], list[int], str]:
    """np=4, min_np=2 on `backend`, with `faults` (tests/elastic/_jobs.py `Plan`): one attempt
    whose worlds re-form in place, nothing restarted; every sample of every epoch once, the
    weights those of one process, nothing of the run left on the engine. Returns the results,
    the worlds and the driver's stderr."""
    (folder / _jobs.BACK_MARK).touch()  # no host is lost: a lost rank's slot is free at once
    plan = _jobs.Plan(str(folder), full=NP, samples=64, epochs=2, wait_for_return=True, **faults)
    with timed(f"elastic {backend}: a rank lost in a phase of the world ({faults})"):
        results = hora.run(
            _jobs.train, (plan,), np=NP, min_np=2, max_np=NP, backend=backend, timeout=JOB_TIMEOUT
        )
    _steps, worlds = _jobs.check_trained_once(plan, results, atol=1e-9)
    if backend == "ray":
        assert not live_actors() and not live_placement_groups()
    else:  # no Spark job of the run left (each rank's task is one)
        from pyspark import SparkContext

        assert not SparkContext._active_spark_context.statusTracker().getActiveJobsIds()
    err = capfd.readouterr().err
    assert "hora: restarting" not in err and "attempt 1 of" not in err, err
    return results, worlds, err


@pytest.mark.timeout(300)
def test_spark_gives_up_a_growth_whose_new_rank_is_lost_before_it_waits(whole, tmp_path, capfd):
    """Rank 3 SIGKILLs itself mid-epoch: ranks 0-2 re-form in place, in their processes; the
    first task started to grow back loses its rank before init: the growth is given up (the
    running ranks never heard of it), its task ends and frees its slot, and the next growth's
    new task joins."""
    faults = {"fault": "self", "joiner_fault": "before"}
    results, worlds, err = _lost_in_a_phase(tmp_path, "spark", capfd, **faults)
    assert worlds == [NP, 3, NP], worlds
    _jobs.check_survivors(str(tmp_path), results, worlds)
    assert "hora: resizing in place from 4 to 3 ranks (rank 3 failed: killed by signal 9" in err
    assert "hora: giving up the growth in place (lost during the growth: rank 3 failed" in err, err
    assert "hora: resized in place from 3 to 4 ranks in " in err, err


@pytest.mark.timeout(300)
def test_spark_rank_0_lost_while_a_new_rank_starts_re_forms_the_others_without_it(
    whole, tmp_path, capfd
):
    """Rank 3 SIGKILLs itself (4 -> 3); while the first new task's rank starts, rank 0 (holding
    its commit until the run grows) SIGKILLs itself: the new rank is given up and ranks 1 and 2
    re-form as ranks 0 and 1 (3 -> 2) in their processes, and train on (a new growth may finish
    before the run does)."""
    results, worlds, err = _lost_in_a_phase(
        tmp_path, "spark", capfd, fault="self", joiner_fault="running"
    )
    assert worlds[:3] == [NP, 3, 2] and worlds[3:] in ([], [NP]), worlds
    logs = _jobs.read_logs(str(tmp_path))
    assert {a for a, _ in logs} == {0}, sorted(logs)  # one attempt
    pids = [{r: e[0]["pid"] for r, e in logs[life].items()} for life in sorted(logs)]
    for world in pids[2:]:  # ranks 1 and 2 of the world of 3, in their processes
        assert [world[0], world[1]] == [pids[1][1], pids[1][2]], pids
    assert [r["pid"] for r in results] == [pids[-1][r] for r in range(worlds[-1])]
    assert "hora: giving up the growth in place (lost during the growth: rank 0 failed" in err
    assert "hora: resizing in place from 3 to 2 ranks" in err, err


@pytest.mark.timeout(300)
def test_ray_survivors_of_a_rank_lost_before_the_first_world_gathered_form_a_smaller_one(
    whole, tmp_path, capfd
):
    """Rank 3 SIGKILLs itself before its hvd.init(): ranks 0-2, waiting at the first world's
    presence barrier in the launcher's store, hear of a world of 3 there and gather it, in
    their processes; rank 3's actor, alive, runs the new rank that grows the run back to 4."""
    results, worlds, err = _lost_in_a_phase(tmp_path, "ray", capfd, start_fault=True)
    assert worlds == [3, NP], worlds  # the first world of 4 never trained
    _jobs.check_survivors(str(tmp_path), results, worlds)
    assert "hora: resizing in place from 4 to 3 ranks (rank 3 failed: killed by signal 9" in err
    assert "hora: resized in place from 3 to 4 ranks in " in err, err
