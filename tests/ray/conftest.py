"""A real local Ray for the engine's tests: one head per test module, dashboard off.

Skipped cleanly when ray is missing. Ray's own processes (GCS, raylet, idle workers) carry the
test session's tag, so these tests check hora's own leftovers instead: no hora worker process,
no live actor, no placement group that is not removed, no file descriptor gained.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.conftest import tagged_processes, worker_processes

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Token authentication on every Ray process of the tests alike (a head started by `ray start`, as
# Ray on Spark does, and the drivers that connect to it): Ray's default differs between the two,
# and Ray reads it when it is imported.
os.environ.setdefault("RAY_AUTH_MODE", "token")
ray = pytest.importorskip("ray", reason="ray is not installed")


def start_ray(num_cpus: int = 4, **options):
    """A fresh local Ray head; hora's own traffic stays on loopback (one machine)."""
    return ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
        **options,
    )


def stop_ray() -> None:
    """Stop Ray and wait for its processes (GCS, raylet, workers) to end."""
    ray.shutdown()
    deadline = time.monotonic() + 30
    while _ray_processes() and time.monotonic() < deadline:
        time.sleep(0.1)


def _ray_processes() -> list[int]:
    return [pid for pid in tagged_processes() if pid != os.getpid()]


def live_actors() -> list[str]:
    """Actors the cluster does not report dead (hora's are killed after every run)."""
    if not ray.is_initialized():
        return []
    states = ray._private.state.actors()
    return [i for i, a in states.items() if a.get("State") != "DEAD"]


def live_placement_groups() -> list[str]:
    if not ray.is_initialized():
        return []
    table = ray.util.placement_group_table()
    return [i for i, g in table.items() if g.get("state") != "REMOVED"]


@pytest.fixture(autouse=True)
def nothing_left_on_ray():
    yield
    deadline = time.monotonic() + 10
    while (left := worker_processes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"hora worker processes left running after the test: {left}"
    assert not live_actors(), f"actors left alive: {live_actors()}"
    assert not live_placement_groups(), f"placement groups left: {live_placement_groups()}"
