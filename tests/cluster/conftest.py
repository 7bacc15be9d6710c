"""Fixtures for the multi-host tests: a cluster of namespaced hosts (`_cluster.Cluster`), started
once per test module, with Spark standalone or Ray on it and this process as the driver on the
bridge address.

Skipped, with the reason, where namespaces cannot be made (not root, no `ip`/`unshare`, no bridge)
or where the engine is not installed. Every cluster process carries this test session's tag, so
the per-test check below finds any hora worker left on a host. The run's timings (cluster start
and stop, each job) and the rank -> host tables are printed at the end of the session.
"""

from __future__ import annotations

import contextlib
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
    with the engines named."""
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


# ----- Spark ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def spark_cluster() -> Iterator[Cluster]:
    """Spark standalone on the hosts, and an active SparkSession whose driver is this process
    (bound to the bridge address); every executor registered before the first test."""
    with spark_on_hosts() as cluster:
        yield cluster


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
    if "pyspark" in sys.modules:
        from tests.spark.conftest import end_spark_jvm

        end_spark_jvm()


# ----- Ray -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Cluster]:
    """A Ray head (no CPUs) on the bridge and one Ray node per host; this process connected."""
    with ray_on_hosts() as cluster:
        yield cluster


@contextlib.contextmanager
def ray_on_hosts(hosts: int = HOSTS, cores: int = CORES) -> Iterator[Cluster]:
    """`ray_cluster` on `hosts` hosts of `cores` CPUs each; stopped however the module ends."""
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
