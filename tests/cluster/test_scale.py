"""hora at real scale on Spark standalone: 8 namespaced hosts x 4 slots, 32 ranks (issue 45).

One cluster for the module, and two jobs:

- np=32: every op kind (allreduce in its forms, allgather, broadcast, alltoall, reducescatter, a
  process set, join) checked on every rank on the hierarchical path (shared memory within each
  host, gloo across the 8), the ranks numbered host by host; then hora.torch's
  DistributedOptimizer trains, and every rank ends with the weights of one process.
- an elastic run, np=32, min_np=28, max_np=32: host 8 (the last rank's) is killed mid-epoch, the
  28 ranks of hosts 1-7 re-form in place in their processes; host 8 comes back, 4 new tasks
  join and the run grows back to 32 in place; every sample of every epoch once, the weights
  those of one process. The loss's and the return's figures are noted (not asserted: this
  machine is shared): the first step at 28 ranks after the kill, the first step at 32 after
  host 8's worker registered again, and the driver's own breakdown of the growth.

At this size the negotiation is a tree two levels deep (HORA_NEGOTIATION_FANOUT 8) and gloo
connects its pairs on first use (TORCH_GLOO_LAZY_INIT).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hora
from tests.cluster import _scale_jobs
from tests.cluster._checks import (
    Watcher,
    assert_trained_like_one_process,
)
from tests.cluster._cluster import Cluster
from tests.cluster.conftest import (
    make_whole,
    note,
    spark_on_hosts,
    timed,
    wait_for_spark_executors,
)
from tests.elastic import _jobs as _elastic

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

HOSTS, CORES, NP = _scale_jobs.HOSTS, _scale_jobs.CORES, _scale_jobs.NP
SMALL = NP - CORES  # a host lost
JOB_TIMEOUT = 600.0
SETTLE = "2"  # HORA_ELASTIC_SETTLE_SECONDS, as tests/cluster/test_elastic.py


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Spark standalone on 8 hosts x 4 cores; this process the driver."""
    with spark_on_hosts(HOSTS, CORES) as found:
        yield found


@pytest.fixture(scope="module")
def every_op_and_trained(cluster) -> list[dict[str, Any]]:
    return _scale_jobs.run_every_op_then_train("spark", JOB_TIMEOUT)


def test_32_ranks_are_numbered_host_by_host(every_op_and_trained):
    _scale_jobs.assert_numbered_host_by_host([r["where"] for r in every_op_and_trained])


def test_every_op_gives_the_right_result_on_the_hierarchical_path(every_op_and_trained):
    _scale_jobs.assert_every_op_right(every_op_and_trained)


def test_distributed_optimizer_on_32_ranks_equals_one_process(every_op_and_trained):
    assert_trained_like_one_process(every_op_and_trained)


# ----- a host lost and back, in place -----------------------------------------------------------
class HostFault:
    """Kills the host the job's last rank marks (the time kept), and once the run is small
    brings it back: its Spark worker started again (kept: when it registered with the master)
    and its executor registered with the session, then BACK_MARK."""

    def __init__(self, cluster: Cluster, folder: Path) -> None:
        self.cluster, self.folder = cluster, folder
        self.times: dict[str, float] = {}

    def kill(self, host: str) -> None:
        self.cluster.kill_host(host)
        self.times["killed"] = time.time()

    def bring_back(self, _: str) -> None:
        self.times["asked"] = time.time()
        self.cluster.make_whole()  # returns once host 8's worker registered with the master
        self.times["worker"] = time.time()
        from pyspark import SparkContext

        wait_for_spark_executors(SparkContext._active_spark_context, HOSTS)
        self.times["executor"] = time.time()
        (self.folder / _elastic.BACK_MARK).touch()

    def watchers(self) -> tuple[Watcher, Watcher]:
        def marked(name: str):
            return lambda: (
                (self.folder / name).exists() and ((self.folder / name).read_text() or "yes")
            )

        return (
            Watcher(marked(_elastic.HOST_MARK), self.kill),
            Watcher(marked(_elastic.SMALL_MARK), self.bring_back),
        )


@pytest.mark.timeout(900)
def test_a_lost_host_re_forms_in_place_and_grows_back_in_place(
    cluster, tmp_path, capfd, monkeypatch
):
    monkeypatch.setenv("HORA_ELASTIC_SETTLE_SECONDS", SETTLE)
    plan = _elastic.Plan(
        str(tmp_path),
        full=NP,
        samples=NP * 4 * 4,  # 4 steps of 4 samples a rank per epoch at 32 ranks
        epochs=2,
        fault="host",
        fault_commit=1,
        wait_for_return=True,
        step_seconds=0.05,
    )
    fault = HostFault(cluster, tmp_path)
    killer, returner = fault.watchers()
    try:
        with killer, returner, timed(f"scale: elastic np={NP}, host lost and back"):
            results = hora.run(
                _elastic.train,
                (plan,),
                np=NP,
                min_np=SMALL,
                max_np=NP,
                backend="spark",
                timeout=JOB_TIMEOUT,
            )
    finally:
        make_whole(cluster)
    err = capfd.readouterr().err
    _steps, worlds = _elastic.check_trained_once(plan, results, atol=1e-9)
    assert worlds == [NP, SMALL, NP], worlds
    logs = _elastic.check_in_place(plan.folder, results, small=SMALL)
    lost = killer.value
    assert {r["host"] for r in results[SMALL:]} == {lost}, [r["host"] for r in results]
    assert "hora: restarting" not in err and "hora: resizing from" not in err, err
    assert re.search(rf"hora: resizing in place from {NP} to {SMALL} ranks \(lost {lost}: ", err)
    grew = re.search(
        rf"hora: growth from {SMALL} to {NP} ranks: the new ranks' start \(process, imports, "
        r"init\) ([0-9.]+) s, then the running ranks' way to their next commit and the sync "
        r"([0-9.]+) s",
        err,
    )
    assert grew, err
    _note_figures(lost, logs, fault.times, grew.groups())


def _first_step(logs: dict, life: tuple[int, int]) -> float:
    return min(e["t"] for entries in logs[life].values() for e in entries if "n" in e)


def _note_figures(lost: str, logs: dict, times: dict[str, float], growth: tuple[str, ...]) -> None:
    at_small = _first_step(logs, (0, 1)) - times["killed"]
    at_full = _first_step(logs, (0, 2))
    note(
        f"  scale: {lost} killed -> first step at {SMALL} ranks {at_small:.2f} s; its Spark "
        f"worker registered -> first step at {NP} ranks {at_full - times['worker']:.2f} s "
        f"(its executor registered -> {at_full - times['executor']:.2f} s; from the restart of "
        f"its services {at_full - times['asked']:.2f} s); the driver's growth: the new ranks' "
        f"start {growth[0]} s, the running ranks' way to their commit and the sync {growth[1]} s"
    )
