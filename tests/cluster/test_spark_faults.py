"""Faults on Spark standalone over 2 namespaced hosts x 2 slots: a killed executor JVM, a host that
vanishes (with and without enough slots left), a host cut off mid-collective, lossy links.

Each test makes the cluster whole again when it ends (links up and unshaped, every host's
Spark worker running, every slot back), so the next one starts from a clean cluster.
"""

from __future__ import annotations

import contextlib
import io
import re
import time
from collections.abc import Iterator

import pytest

import hora
from tests.cluster import _jobs
from tests.cluster._checks import (
    JOB_TIMEOUT,
    Watcher,
    assert_spread,
    assert_trained_like_one_process,
    cut_off_mid_collective,
    marked_host,
    placement_table,
)
from tests.cluster._cluster import Cluster
from tests.cluster._hosts import Shape, ShapingUnsupported
from tests.cluster.conftest import CORES, HOSTS, make_whole, note, timed

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

NP = HOSTS * CORES
FAULT_STEP = 5


@pytest.fixture
def cluster(spark_cluster: Cluster) -> Iterator[Cluster]:
    yield spark_cluster
    make_whole(spark_cluster)


def test_a_killed_executor_jvm_restarts_the_job(cluster, tmp_path, capfd):
    """Rank 1 kills the executor JVM it runs under: that host's Spark worker starts a new one,
    and the second attempt resumes from the last checkpoint with 2 ranks per host again."""
    with timed("spark: executor JVM killed, restart (np=4)"):
        results = hora.run(
            _jobs.train,
            (str(tmp_path), "kill_executor", FAULT_STEP),
            np=NP,
            backend="spark",
            max_restarts=1,
            timeout=JOB_TIMEOUT,
        )
    places = [r["where"] for r in results]
    note(f"spark executor-kill attempt 2 placement: {placement_table(places)}")
    assert_spread(places, HOSTS, CORES)
    assert {(r["attempt"], r["start"]) for r in results} == {(1, FAULT_STEP)}
    assert_trained_like_one_process(results)
    out, err = capfd.readouterr()
    assert "killing executor JVM" in out
    # rank 1, or the rank sharing its executor: seen by its closed channel, or (whichever the
    # driver hears first) by Spark's failed stage naming the lost executor
    channel = r"rank \d+ failed on host \S+: its Spark task ended"
    stage = r"Spark task \d+ on host \S+ \(rank \d+\) failed: "
    assert re.search(rf"hora: attempt 1 of 2 failed: ({channel}|{stage})", err), err
    assert re.search(channel, err) or "ExecutorLostFailure" in err, err
    assert "hora: attempt 2 of 2 starting" in err, err


def test_a_vanished_host_restarts_on_the_slots_left(cluster, tmp_path, capfd):
    """2 ranks, one per host; rank 1's host vanishes (every process on it killed): the second
    attempt runs both ranks on the other host, whose 2 slots are enough."""
    with (
        Watcher(marked_host(tmp_path), cluster.kill_host) as killer,
        timed("spark: host vanished, restart on the host left (np=2)"),
    ):
        results = hora.run(
            _jobs.train,
            (str(tmp_path), "kill_host", FAULT_STEP),
            np=2,
            backend="spark",
            max_restarts=1,
            start_timeout=60,
            timeout=JOB_TIMEOUT,
        )
    gone = killer.value
    places = [r["where"] for r in results]
    note(f"spark host-vanished: {gone} killed; attempt 2 placement: {placement_table(places)}")
    assert gone in {f"host{i}" for i in range(1, HOSTS + 1)}
    assert all(p["host"] != gone for p in places), placement_table(places)
    assert {(r["attempt"], r["start"]) for r in results} == {(1, FAULT_STEP)}
    assert_trained_like_one_process(results)
    err = capfd.readouterr().err
    assert "hora: attempt 1 of 2 failed: " in err and "hora: attempt 2 of 2 starting" in err, err


@pytest.fixture(scope="module")
def vanished_without_slots(spark_cluster, tmp_path_factory) -> dict[str, str]:
    """4 ranks; a host vanishes and 2 slots are left, so the restart cannot place 4 ranks.
    What the user is told: the error, and hora's own lines on stderr."""
    folder = tmp_path_factory.mktemp("vanished")
    driver_says = io.StringIO()
    began = time.monotonic()
    try:
        with (
            Watcher(marked_host(folder), spark_cluster.kill_host) as killer,
            contextlib.redirect_stderr(driver_says),
            pytest.raises(Exception) as info,
        ):
            hora.run(
                _jobs.train,
                (str(folder), "kill_host", FAULT_STEP),
                np=NP,
                backend="spark",
                max_restarts=1,
                start_timeout=10,
                timeout=JOB_TIMEOUT,
            )
    finally:
        make_whole(spark_cluster)
    gone = spark_cluster.host(killer.value)
    seconds = time.monotonic() - (killer.acted_at or began)
    error = f"{type(info.value).__name__}: {info.value}"
    said = " | ".join(s for s in driver_says.getvalue().splitlines() if s.startswith("hora:"))
    note(f"spark host-vanished, slots short: {gone.name} killed, failed {seconds:.1f} s later")
    note(f"  error: {error}")
    note(f"  hora said: {said}")
    return {"host": gone.name, "address": gone.address, "error": error, "said": said}


def test_a_vanished_host_without_enough_slots_left_fails_saying_so(vanished_without_slots):
    error = vanished_without_slots["error"]
    assert f"ValueError: np={NP} needs {NP} Spark task slots at once" in error, error
    assert "this cluster can run 2" in error, error
    said = vanished_without_slots["said"]
    assert re.search(r"hora: attempt 1 of 2 failed: rank \d+ failed", said), said


def test_a_vanished_host_without_enough_slots_left_names_the_host(vanished_without_slots):
    told = vanished_without_slots["error"] + vanished_without_slots["said"]
    host, address = vanished_without_slots["host"], vanished_without_slots["address"]
    assert re.search(rf"\b({host}|{re.escape(address)})\b", told), told


def test_a_host_cut_off_mid_collective_is_reported_within_60s_naming_it(cluster, tmp_path):
    cut = cut_off_mid_collective(cluster, tmp_path, "spark", NP)
    note(f"spark cut-off: {cut}")
    cut.assert_reported_in_time_naming_the_host()


def test_training_over_lossy_jittery_links_gives_the_same_result(cluster):
    """1% loss and 5 +- 5 ms of delay on every link, both ways: the same model as one process."""
    try:
        cluster.shape(Shape(delay_ms=5, jitter_ms=5, loss_pct=1))
    except ShapingUnsupported as exc:
        pytest.skip(str(exc))
    with timed("spark: training over 1% loss, 5 +- 5 ms (np=4)"):
        results = hora.run(_jobs.train, np=NP, backend="spark", timeout=JOB_TIMEOUT)
    places = [r["where"] for r in results]
    note(f"spark lossy training placement: {placement_table(places)}")
    assert_spread(places, HOSTS, CORES)
    assert_trained_like_one_process(results)
