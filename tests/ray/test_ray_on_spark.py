"""Ray on Spark: `ray.util.spark.setup_ray_cluster` on a `local-cluster` Spark, a hora job on it.

Ray's worker nodes run as ordinary (non-barrier) Spark tasks, one per executor; hora places its
ranks on them as on any Ray cluster. `local-cluster[2,1,1024]` is enough: the 1024 MB is the
executors' JVM heap, while a Ray worker node is a process of its own whose memory Ray sizes from
the machine's. Slow (Spark, then a Ray head and two Ray nodes): one job, end to end.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from tests.conftest import wait_for_no_processes
from tests.ray.conftest import live_actors, live_placement_groups, ray

pytest.importorskip("pyspark", reason="pyspark is not installed")
if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
    pytest.skip("Java is not installed: Spark cannot start", allow_module_level=True)

from tests.spark.conftest import start_spark, stop_spark  # after the skips

pytestmark = [pytest.mark.spark, pytest.mark.ray]


def allreduce() -> tuple[str, float]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return os.environ["RANK"], t.item()


@pytest.fixture(scope="module")
def ray_on_spark(monkeypatch_module):
    # Ray on Spark sleeps fixed times meant for a cloud cluster's first start: 20 s for its head,
    # 30 s for the background Spark job, 10 s between two worker nodes of one machine (the
    # executors read theirs from the environment they inherit). Shortened, not skipped.
    monkeypatch_module.setenv("RAY_ON_SPARK_BACKGROUND_JOB_STARTUP_WAIT", "5")
    monkeypatch_module.setenv("RAY_ON_SPARK_RAY_WORKER_NODE_STARTUP_INTERVAL", "2")
    from ray.util.spark import cluster_init, setup_ray_cluster, shutdown_ray_cluster

    monkeypatch_module.setattr(cluster_init, "_RAY_HEAD_STARTUP_TIMEOUT", 8)
    monkeypatch_module.setattr(cluster_init, "_BACKGROUND_JOB_STARTUP_WAIT", 5)
    # And it waits its full 60 s for a dashboard port that include_dashboard=False never opens.
    monkeypatch_module.setattr(cluster_init, "_RAY_DASHBOARD_STARTUP_TIMEOUT", 1)
    # Ray on Spark starts its nodes with the `ray` command: the one of this interpreter.
    monkeypatch_module.setenv(
        "PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    )
    spark = start_spark("local-cluster[2,1,1024]", **{"spark.task.maxFailures": "1"})
    try:
        address, _ = setup_ray_cluster(
            max_worker_nodes=2,
            num_cpus_worker_node=1,
            num_gpus_worker_node=0,
            include_dashboard=False,
        )
        ray.init(address=address, log_to_driver=False)
        yield spark
    finally:
        # Not tests/ray's stop_ray: it waits for Ray's processes, which live until the cluster
        # is shut down; `_end_spark` waits for every one of them to end.
        ray.shutdown()
        shutdown_ray_cluster()
        _end_spark(spark)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _end_spark(spark) -> None:
    """Stop the session and pyspark's JVM, so that later tests see none of Spark's processes."""
    from pyspark import SparkContext

    stop_spark(spark)
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc is not None:
        proc.stdin.close()
        proc.terminate()
        proc.wait(timeout=30)
    # Ray's nodes were Spark tasks' children: they end a moment after their executors do.
    left = wait_for_no_processes(timeout=60)
    assert not left, f"Ray on Spark left processes running: {left}"


def test_a_hora_job_runs_on_ray_on_spark(ray_on_spark):
    import hora

    # Spark is active too: `auto` would pick Spark, so the Ray engine is named.
    assert hora.run(allreduce, np=2, backend="ray") == [("0", 3.0), ("1", 3.0)]
    assert not live_actors() and not live_placement_groups()
