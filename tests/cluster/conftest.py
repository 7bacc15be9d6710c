"""Fixtures for the multi-host tests: a cluster of namespaced hosts (`_cluster.Cluster`), with
Spark standalone or Ray on it and this process as the driver on the bridge address. The 2 x 2
cluster is kept from one module to the next that asks for the same engines (test_elastic.py to
test_ray.py, test_spark.py to test_spark_faults.py), made whole between them; a module of
another shape starts its own.

Skipped, with the reason, where namespaces cannot be made (not root, no `ip`/`unshare`, no bridge)
or where the engine is not installed. Every cluster process carries this test session's tag, so
the per-test check below finds any hora worker left on a host. The run's timings (cluster start
and stop, each job) and the rank -> host tables are printed at the end of the session.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster._cluster import Cluster
from tests.cluster._hosts import ClusterUnavailable, why_unavailable
from tests.conftest import TAG, worker_processes

# As tests/ray: the same Ray token mode on the driver and on every node (read at `import ray`).
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "token")

HOSTS = 2
CORES = 2  # Spark slots and Ray CPUs per host: 4 ranks, 2 per host
WAIT_SECONDS = 120.0
NOTES: list[str] = []  # timings and placements, printed in the terminal summary


def note(text: str) -> None:
    NOTES.append(text)


@contextlib.contextmanager
def timed(what: str) -> Iterator[None]:
    """Note how long `what` took, failed or not."""
    began = time.monotonic()
    try:
        yield
    finally:
        note(f"{time.monotonic() - began:6.1f} s  {what}")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if NOTES:
        terminalreporter.section("tests/cluster: timings and placements")
        for line in NOTES:
            terminalreporter.write_line(line)


def start_cluster(hosts: int = HOSTS, cores: int = CORES, **engines: bool) -> Cluster:
    """`hosts` namespaced hosts of `cores` slots each (2 x 2 unless a module asks for more),
    with the engines named (a kept cluster stopped first: `release_kept`)."""
    release_kept()
    reason = why_unavailable()
    if reason:
        pytest.skip(f"no test cluster of namespaced hosts: {reason}")
    cluster = Cluster(hosts, cores, extra_env={TAG: os.environ[TAG]}, **engines)
    try:
        cluster.start()
    except ClusterUnavailable as exc:
        pytest.skip(f"no test cluster of namespaced hosts: {exc}")
    kinds = "+".join(name for name, wanted in engines.items() if wanted)
    note(f"{cluster.start_seconds:6.1f} s  start {hosts}-host cluster ({kinds})")
    return cluster


def stop_cluster(cluster: Cluster) -> None:
    cluster.stop()
    note(f"{cluster.stop_seconds:6.1f} s  stop cluster")


# ----- one 2-host cluster kept from module to module ------------------------------------------
@dataclasses.dataclass
class Kept:
    """The 2 x 2 cluster of the module before, with its engines' driver side (SparkSession, Ray
    connection): the next module that asks for the same engines starts none (about 10-15 s a
    start and its session on this machine's 2 cores)."""

    engines: tuple[bool, bool]  # (spark, ray)
    cluster: Cluster
    session: Any = None


KEPT: list[Kept] = []  # at most one


def kept_cluster(spark: bool, ray: bool) -> Cluster:
    """The kept 2 x 2 cluster if it runs these engines, else a new one (the kept one stopped
    first): a SparkSession on it with every executor registered (`spark`), this process
    connected to its Ray head with every CPU free (`ray`)."""
    if KEPT and KEPT[0].engines == (spark, ray):
        return KEPT[0].cluster
    if spark:
        pytest.importorskip("pyspark", reason="pyspark is not installed")
        if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
            pytest.skip("Java is not installed: Spark cannot start")
    if ray:
        pytest.importorskip("ray", reason="ray is not installed")
    cluster = start_cluster(spark=spark, ray=ray)
    kept = Kept((spark, ray), cluster)
    KEPT.append(kept)
    try:
        with timed(f"start SparkSession ({spark}), connect to Ray ({ray}), every slot there"):
            if spark:
                kept.session = spark_session_on(cluster)
            if ray:
                connect_ray(cluster)
    except BaseException:
        release_kept()
        raise
    return cluster


def release_kept() -> None:
    """Stop the kept cluster and its engines' driver side, if any."""
    if not KEPT:
        return
    kept = KEPT.pop()
    try:
        if kept.engines[1]:
            import ray

            ray.shutdown()
        if kept.session is not None:
            from tests.spark.conftest import stop_spark

            stop_spark(kept.session)
    finally:
        stop_cluster(kept.cluster)


@contextlib.contextmanager
def kept_for_a_module(request: pytest.FixtureRequest, spark: bool, ray: bool) -> Iterator[Cluster]:
    """`kept_cluster` for one module; when it ends, the cluster made whole (every link up,
    every host that was cut off or killed started again, every slot back) for the next module.
    A module with a failed test, or a cluster that cannot be made whole, hands on nothing:
    the next module starts its own, as if none had been kept."""
    failed = request.session.testsfailed
    cluster = kept_cluster(spark, ray)
    try:
        yield cluster
    finally:
        try:
            make_whole(cluster)
        except BaseException:
            release_kept()
            raise
        if request.session.testsfailed != failed:
            release_kept()


@pytest.fixture(scope="module")
def spark_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """Spark standalone on the hosts, and an active SparkSession whose driver is this process
    (bound to the bridge address); every executor registered before the first test. Kept for
    the next module that asks for it (test_spark.py, then test_spark_faults.py)."""
    with kept_for_a_module(request, spark=True, ray=False) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def spark_and_ray_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """Spark standalone and Ray on the same hosts, this process the driver of both (a
    SparkSession, a Ray connection). Kept for the next module that asks for it (test_elastic.py,
    then test_ray.py)."""
    with kept_for_a_module(request, spark=True, ray=True) as cluster:
        yield cluster


# ----- Spark ---------------------------------------------------------------------------------
@contextlib.contextmanager
def spark_on_hosts(hosts: int = HOSTS, cores: int = CORES) -> Iterator[Cluster]:
    """`spark_cluster` on `hosts` hosts of `cores` slots each (for a module that asks for
    another shape); the cluster stopped however the module ends."""
    pytest.importorskip("pyspark", reason="pyspark is not installed")
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("Java is not installed: Spark cannot start")
    from tests.spark.conftest import stop_spark

    cluster = start_cluster(hosts, cores, spark=True, ray=False)
    session = None
    try:
        with timed(f"start SparkSession, every executor registered ({hosts} hosts)"):
            session = spark_session_on(cluster)
        yield cluster
    finally:
        if session is not None:
            stop_spark(session)
        stop_cluster(cluster)


def spark_session_on(cluster: Cluster, cores: int | None = None, memory: str = "512m") -> Any:
    """A SparkSession on the cluster's master, this process its driver on the bridge address,
    one executor of `cores` (the cluster's by default) per host; returns once every host's
    executor has registered."""
    from tests.spark.conftest import start_spark

    session = start_spark(
        cluster.spark_master,
        **{
            "spark.driver.host": cluster.driver_address,
            "spark.driver.bindAddress": cluster.driver_address,
            "spark.executor.memory": memory,
            "spark.executor.cores": str(cores or cluster.cores),
        },
    )
    wait_for_spark_executors(session.sparkContext, cluster.count)
    return session


def connect_ray(cluster: Cluster) -> None:
    """This process connected to the cluster's Ray head; returns once every host's CPUs are
    free."""
    import ray

    ray.init(
        address=cluster.ray_address, _node_ip_address=cluster.driver_address, log_to_driver=False
    )
    wait_for_ray_cpus(cluster.count * cluster.cores)


def wait_for_spark_executors(sc: Any, count: int, seconds: float = WAIT_SECONDS) -> None:
    """Until `count` executors are registered with the session (they come a while after it
    starts, or after a host is back); each has the cluster's cores as slots."""
    deadline = time.monotonic() + seconds
    while (have := sc._jsc.sc().getExecutorMemoryStatus().size() - 1) < count:  # - the driver
        if time.monotonic() > deadline:
            raise RuntimeError(f"{have} of {count} Spark executors after {seconds} s")
        time.sleep(0.2)


def make_whole(cluster: Cluster) -> None:
    """After a fault: the cluster as it started (`Cluster.make_whole`), and every slot or CPU
    back in the driver's view."""
    cluster.make_whole()
    if cluster.spark is not None:
        from pyspark import SparkContext

        wait_for_spark_executors(SparkContext._active_spark_context, cluster.count)
    if cluster.ray is not None:
        wait_for_ray_cpus(cluster.count * cluster.cores)


def wait_for_ray_nodes(count: int, seconds: float = WAIT_SECONDS) -> None:
    """Until `count` Ray nodes with CPUs are alive in the driver's view. (Their CPUs need not
    be free: a run's placement group takes them again for the bundles it lost.)"""
    import ray

    deadline = time.monotonic() + seconds
    while (
        have := sum(bool(n["Alive"] and n["Resources"].get("CPU")) for n in ray.nodes())
    ) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{have} of {count} Ray nodes alive after {seconds} s")
        time.sleep(0.1)


def wait_for_ray_cpus(cpus: int, seconds: float = WAIT_SECONDS) -> None:
    import ray

    deadline = time.monotonic() + seconds
    while (have := ray.available_resources().get("CPU", 0)) < cpus:
        if time.monotonic() > deadline:
            raise RuntimeError(f"Ray has {have} of {cpus} CPUs free after {seconds} s")
        time.sleep(0.2)


@pytest.fixture(scope="package", autouse=True)
def spark_jvm_ends_with_these_tests() -> Iterator[None]:
    """The session's JVM carries this test session's tag: end it, as tests/spark does, so later
    tests' check that nothing survives sees none of it."""
    yield
    release_kept()
    if "pyspark" in sys.modules:
        from tests.spark.conftest import end_spark_jvm

        end_spark_jvm()


# ----- Ray -------------------------------------------------------------------------------------
@contextlib.contextmanager
def ray_on_hosts(hosts: int = HOSTS, cores: int = CORES) -> Iterator[Cluster]:
    """A Ray head (no CPUs) on the bridge and one Ray node per host of `cores` CPUs, this
    process connected; stopped however the module ends (test_scale_ray.py's 8 hosts)."""
    ray = pytest.importorskip("ray", reason="ray is not installed")
    cluster = start_cluster(hosts, cores, spark=False, ray=True)
    try:
        with timed(f"connect to Ray, every node alive ({hosts} hosts)"):
            connect_ray(cluster)
        yield cluster
    finally:
        ray.shutdown()
        stop_cluster(cluster)


# ----- every test ------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def no_rank_survives() -> Iterator[None]:
    """No hora worker is left on any host (or here) after a test."""
    yield
    deadline = time.monotonic() + 10
    while (left := worker_processes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"hora worker processes left running after the test: {left}"
