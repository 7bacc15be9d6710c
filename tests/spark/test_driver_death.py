"""A Spark driver SIGKILLed mid-run, on `local-cluster[2,1,1024]`: the driver is a process of its
own (tests/_driver_death.py) with its own SparkSession, whose JVM runs the local-cluster's master
and worker and starts its two executor JVMs; none of them may outlive it."""

from __future__ import annotations

import pytest

from tests import _driver_death

pytestmark = pytest.mark.spark


def test_a_killed_drivers_ranks_executors_and_python_workers_are_gone(tmp_path):
    """Each rank (and the child it started) is gone within seconds: it sees the driver's
    channel close and kills its process group (and its task's supervisor, seeing its own
    channel close, stops it too); the executor JVMs, their Python workers (the supervisors)
    and the driver's JVM end as well: nothing with the driver's tag is left."""
    master = "local-cluster[2,1,1024]"
    driver = _driver_death.start_driver(tmp_path, "spark", str(tmp_path), master, "2")
    try:
        ranks = _driver_death.wait_for_ranks(driver, np=2)
        executors = driver.executors()
        supervisors = {r["parent"] for r in ranks}  # the Spark tasks' Python workers
        assert len(executors) == 2 and len(supervisors) == 2, (executors, ranks)
        assert all(r["shm"] for r in ranks), ranks  # one host: they met in shared memory
        pids = [pid for r in ranks for pid in (r["pid"], r["child"])]
        took = _driver_death.kill_and_time(driver, pids)
        rest, left = _driver_death.wait_until_gone(driver.tagged, 30)
    finally:
        driver.stop()
    print(
        f"spark {master}: the ranks and their children gone {took:.2f} s after the driver was "
        f"killed, every executor JVM and Python worker {took + rest:.2f} s after"
    )
    assert not left, [_driver_death.cmdline(pid)[:200] for pid in left]
    assert not _driver_death.segments_left(ranks)
