"""Faults on Spark standalone over 2 namespaced hosts x 2 slots: a killed executor JVM, a host that
vanishes (with and without enough slots left), a host cut off mid-collective, a lossy link (5%
of host 2's packets dropped at random by nftables, this kernel having no netem), and a
flapping link (host 2's dropping everything for 10 s mid-run, under an elastic run, with a
heartbeat timeout above and below that).

Each test makes the cluster whole again when it ends (links up and unshaped, every host's
Spark worker running, every slot back), so the next one starts from a clean cluster.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import hora
from hora.engines import STOP_GRACE_SECONDS
from hora.engines.spark.launcher import CANCEL_WAIT_SECONDS
from hora.job.silence import SILENCE_VAR
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
from tests.cluster._hosts import Shape
from tests.cluster.conftest import CORES, HOSTS, make_whole, note, timed
from tests.elastic import _jobs as elastic_jobs

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


LOSSY = f"host{HOSTS}"  # the host whose link loses packets, or flaps


@pytest.fixture(scope="module")
def unshaped(spark_cluster: Cluster) -> tuple[float, float]:
    """The lossy tests' job with no loss: its wall time, and its steps' (the slowest rank's),
    which their slowdown is measured by: the wall time also holds Spark's and the ranks' start,
    slower in the first job on new executors (this one, in a run of these tests alone)."""
    began = time.monotonic()
    results = hora.run(_jobs.train, np=NP, backend="spark", timeout=JOB_TIMEOUT)
    seconds = time.monotonic() - began, max(r["seconds"] for r in results)
    note(f"{seconds[0]:6.1f} s  spark: training, no loss (np=4; its steps {seconds[1]:.2f} s)")
    assert_trained_like_one_process(results)
    return seconds


# 5% only (the suite's budget): 1% was the same job and the same checks, on a link that loses less.
@pytest.mark.parametrize("loss_pct", [5])
def test_training_over_a_lossy_link_gives_the_same_result(cluster, unshaped, loss_pct):
    """`loss_pct`% of the packets of host 2's link lost at random, each way (nftables: this
    kernel has no netem, so there is no delay or jitter): the same model as one process, bit
    for bit on every rank; the slowdown noted."""
    cluster.shape(Shape(loss_pct=loss_pct), [LOSSY])
    began = time.monotonic()
    with timed(f"spark: training over {loss_pct}% loss on {LOSSY}'s link (np=4)"):
        results = hora.run(_jobs.train, np=NP, backend="spark", timeout=JOB_TIMEOUT)
    seconds = time.monotonic() - began, max(r["seconds"] for r in results)
    packets, dropped = cluster.lost(LOSSY)
    note(
        f"  {loss_pct}% loss: {dropped} of {packets} packets dropped "
        f"({100 * dropped / max(packets, 1):.2f}%); the steps' slowdown "
        f"{seconds[1] / unshaped[1]:.2f}x ({seconds[1]:.2f} s against {unshaped[1]:.2f} s); "
        f"the whole job {seconds[0]:.1f} s against {unshaped[0]:.1f} s (that one cold, maybe)"
    )
    places = [r["where"] for r in results]
    assert_spread(places, HOSTS, CORES)
    assert_trained_like_one_process(results)
    assert dropped > 0 and packets > 100, (packets, dropped)  # the job's traffic met the loss


# ----- a flapping link ---------------------------------------------------------------------------
FLAP_SECONDS = 10.0
# How long stopping a Spark attempt may take when a host's ranks cannot hear the stop: the
# engine waits its stop grace (+ 1 s) for their jobs, then cancels them and waits for that.
STOP_SECONDS = STOP_GRACE_SECONDS + 1.0 + CANCEL_WAIT_SECONDS + 1.0


class StampedLines(io.TextIOBase):
    """stderr, passed through, each line kept with the time.monotonic() it was written at."""

    def __init__(self, through: Any) -> None:
        self.through = through
        self.lines: list[tuple[float, str]] = []

    def write(self, text: str) -> int:
        now = time.monotonic()
        self.lines += [(now, line) for line in text.splitlines() if line]
        self.through.write(text)
        return len(text)

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def _training_on_every_rank(folder: Path, steps: int) -> Callable[[], bool]:
    """True once every rank of the first world has logged `steps` steps."""

    def ready() -> bool:
        logs = list(folder.glob("log-0-0-*.jsonl"))
        return len(logs) == NP and all(
            sum('"n":' in line for line in log.read_text().splitlines()) >= steps for log in logs
        )

    return ready


def _flap(cluster: Cluster, host: str, at: dict[str, float]) -> Callable[[bool], None]:
    def flap(_: bool) -> None:
        cluster.shape(Shape(loss_pct=100), [host])
        at["down"] = time.monotonic()
        time.sleep(FLAP_SECONDS)
        cluster.clear_shape()
        at["up"] = time.monotonic()

    return flap


def _flapping_elastic_run(
    cluster: Cluster, folder: Path, silence: float, monkeypatch: Any
) -> tuple[elastic_jobs.Plan, list[dict[str, Any]], StampedLines, dict[str, float]]:
    """An elastic run (np=4, min_np=2, max_np=4) whose host 2 loses every packet, both ways,
    for FLAP_SECONDS once every rank is training, its link then healed; the driver's
    HORA_HEARTBEAT_TIMEOUT_SECONDS `silence`."""
    monkeypatch.setenv(SILENCE_VAR, f"{silence:g}")
    monkeypatch.setenv("HORA_ELASTIC_SETTLE_SECONDS", "2")
    plan = elastic_jobs.Plan(str(folder), full=NP, step_seconds=0.2)
    at: dict[str, float] = {}
    said = StampedLines(sys.stderr)
    with (
        Watcher(_training_on_every_rank(folder, 2), _flap(cluster, LOSSY, at)),
        contextlib.redirect_stderr(said),
        timed(f"spark elastic: {LOSSY}'s link down {FLAP_SECONDS:g} s, {SILENCE_VAR}={silence:g}"),
    ):
        results = hora.run(
            elastic_jobs.train,
            (plan,),
            np=NP,
            min_np=2,
            max_np=NP,
            backend="spark",
            timeout=JOB_TIMEOUT,
        )
    assert "up" in at, f"the link did not flap (the run ended first, or the flap failed): {at}"
    return plan, results, said, at


def _longest_pause(plan: elastic_jobs.Plan) -> float:
    """The longest time between two steps of a rank of the first world."""
    logs = elastic_jobs.read_logs(plan.folder)[0, 0]
    times = [[e["t"] for e in entries if "n" in e] for entries in logs.values()]
    return max(b - a for t in times for a, b in itertools.pairwise(t))


def test_a_link_down_for_less_than_the_heartbeat_timeout_does_not_stop_an_elastic_run(
    cluster, tmp_path, monkeypatch
):
    """Host 2's link drops everything for 10 s, the heartbeat timeout 20 s: the ranks wait in
    their collectives and go on once it heals (TCP retransmits), nothing is resized or
    restarted, and the model is the one of one process."""
    plan, results, said, _ = _flapping_elastic_run(cluster, tmp_path, 20.0, monkeypatch)
    pause = _longest_pause(plan)
    note(f"  flap under the timeout: the ranks paused {pause:.1f} s")
    err = said.text()
    assert "hora: resiz" not in err and "hora: attempt" not in err and "no word" not in err, err
    assert elastic_jobs.check_trained_once(plan, results, atol=1e-9)[1] == [NP]
    assert pause >= FLAP_SECONDS - 1, pause  # the outage was mid-run
    assert {r["world"] for r in results} == {NP}


def test_a_link_down_for_longer_than_the_heartbeat_timeout_is_reported_and_the_run_recovers(
    cluster, tmp_path, monkeypatch
):
    """Host 2's link drops everything for 10 s, the heartbeat timeout 4 s: the driver finds its
    ranks silent at the timeout ("no word from it for 4 s") and says so, naming the host, once
    the attempt is stopped (the Spark engine's stop waits for ranks that cannot hear it:
    STOP_SECONDS at most). The run recovers by a restart of every rank from its last commit (a
    rank only silent may live on, so the survivors do not re-form in place: docs/elastic.md),
    on every slot again once the link is back, and ends with every sample of every epoch once
    and the model of one process on its steps."""
    silence = 4.0
    plan, results, said, at = _flapping_elastic_run(cluster, tmp_path, silence, monkeypatch)
    err = said.text()
    host = cluster.host(LOSSY)
    silent = f"no word from it for {silence:g} s ({SILENCE_VAR}={silence:g}): host {host.name} "
    failed = [(when, line) for when, line in said.lines if "hora: attempt 1 of" in line]
    assert failed and silent in failed[0][1], err
    reported = failed[0][0] - at["down"]
    resumed = [when for when, line in said.lines if "hora: the ranks resumed from commit" in line]
    worlds = elastic_jobs.check_trained_once(plan, results, atol=1e-9)[1]
    note(
        f"  flap over the timeout: reported {reported:.1f} s into the outage ({failed[0][1]}); "
        f"the link back {at['up'] - at['down']:.1f} s into it; the ranks resumed "
        + (f"{resumed[0] - at['up']:.1f} s after it was back" if resumed else "never")
        + f"; worlds {worlds}"
    )
    assert reported < silence + STOP_SECONDS, (reported, err)
    restarted = rf"hora: (restarting|resizing from 4 to) \d ranks \(lost {host.name}: "
    assert re.search(restarted, err) and "in place" not in err, err
    assert worlds[0] == NP, worlds
    assert [r["world"] for r in results] == [worlds[-1]] * worlds[-1], worlds
