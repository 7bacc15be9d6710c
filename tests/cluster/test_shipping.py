"""Nothing installed on the hosts but torch: 2 namespaced hosts whose Python (Spark's executors,
Ray's nodes) has torch and no hora (tests/_nohora.py), Spark standalone and Ray on them.

hora ships itself (a zip through the session's Python files; a Ray `py_modules`), and a module
that only the driver's path has (a notebook's `mymodels.py`) goes with the job by value.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import hora
from tests._nohora import hide_hora
from tests.cluster._cluster import Cluster
from tests.cluster._hosts import ClusterUnavailable, why_unavailable
from tests.cluster._services import ray_token
from tests.cluster.conftest import (
    CORES,
    HOSTS,
    connect_ray,
    note,
    release_kept,
    spark_session_on,
    timed,
)
from tests.conftest import TAG

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.ray]

NP = HOSTS * CORES


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    pytest.importorskip("pyspark", reason="pyspark is not installed")
    ray = pytest.importorskip("ray", reason="ray is not installed")
    from tests.spark.conftest import stop_spark

    release_kept()  # another module's kept cluster (its SparkSession, its Ray connection)
    reason = why_unavailable()
    if reason:
        pytest.skip(f"no test cluster of namespaced hosts: {reason}")
    site = hide_hora(tmp_path_factory.mktemp("no-hora"))
    # Ray's token mode (tests/cluster/conftest.py) needs a token every node and the driver share;
    # the hosts get it through RAY_AUTH_TOKEN.
    token_was = os.environ.get("RAY_AUTH_TOKEN")
    os.environ["RAY_AUTH_TOKEN"] = token_was or ray_token()
    made = Cluster(
        HOSTS, CORES, spark=True, ray=True, extra_env={TAG: os.environ[TAG], "PYTHONPATH": site}
    )
    try:
        made.start()
    except ClusterUnavailable as exc:
        pytest.skip(f"no test cluster of namespaced hosts: {exc}")
    note(f"{made.start_seconds:6.1f} s  start {HOSTS}-host cluster without hora (spark+ray)")
    session = None
    try:
        with timed("start SparkSession, connect to Ray"):
            session = spark_session_on(made)
            connect_ray(made)
        yield made
    finally:
        ray.shutdown()
        if session is not None:
            stop_spark(session)
        made.stop()
        if token_was is None:
            os.environ.pop("RAY_AUTH_TOKEN", None)


@pytest.fixture
def notebook_module(tmp_path, monkeypatch) -> Any:
    """`mymodels_<id>.py` imported from a folder then dropped from sys.path, as a module beside a
    notebook that no host has; the ranks start in a folder of their own (not hora's checkout)."""
    name = f"mymodels_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("def scale():\n    return 3\n")
    sys.path.insert(0, str(tmp_path))
    try:
        module = __import__(name)
    finally:
        sys.path.remove(str(tmp_path))
    monkeypatch.chdir(tmp_path.parent)
    return module


def _job(module: Any):
    def where() -> dict[str, Any]:
        import socket

        import hora as rank_hora

        return {"host": socket.gethostname(), "hora": rank_hora.__file__, "x": module.scale()}

    return where


def test_spark_hosts_without_hora_run_the_job(cluster, notebook_module):
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context

    def finds_hora(_partition):
        import importlib.util

        yield importlib.util.find_spec("hora") is not None

    assert sc.parallelize(range(NP), NP).mapPartitions(finds_hora).collect() == [False] * NP
    with timed(f"spark: job on hosts without hora (np={NP})"):
        found = hora.run(_job(notebook_module), np=NP, backend="spark", timeout=240)
    assert len({r["host"] for r in found}) == HOSTS
    assert all(r["x"] == 3 for r in found)
    for r in found:
        shipped = r["hora"].split(os.sep + "hora" + os.sep)[0]
        assert os.path.basename(shipped).startswith("hora-") and shipped.endswith(".zip"), r


def test_ray_nodes_without_hora_run_the_job(cluster, notebook_module):
    with timed(f"ray: job on nodes without hora (np={NP})"):
        found = hora.run(_job(notebook_module), np=NP, backend="ray", timeout=240)
    assert len({r["host"] for r in found}) == HOSTS
    assert all(r["x"] == 3 for r in found)
    here = os.path.dirname(os.path.dirname(hora.__file__))
    for r in found:
        assert not r["hora"].startswith(here + os.sep), r  # Ray's copy, not the checkout
        assert "runtime_resources" in r["hora"], r
