"""bench/chaos.py on tests/cluster's 2 namespaced hosts x 2 slots (root, `ip`, `unshare`): the
cluster as tests/cluster starts it (Spark standalone or Ray on every host), the run's driver
connected to it as tests/cluster's fixtures connect, and the rank processes on each host, which
the chaos kills one at a time or a host's at once.

Take the shared lock around a run (another session may build the cluster):
`flock /work/cluster.lock sudo .venv/bin/python bench/chaos.py --engine spark`.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.cluster

HOSTS, CORES = 2, 2
#: the helpers' loopback settings, which would pin the driver and gloo to 127.0.0.1
LOOPBACK_VARS = ("MASTER_ADDR", "GLOO_SOCKET_IFNAME", "SPARK_LOCAL_IP")


@contextlib.contextmanager
def cluster(engine: str) -> Iterator[Any]:
    """The 2-host cluster with `engine` on it, stopped however the bench ends."""
    from tests.cluster import conftest  # noqa: F401 -- its Ray variables (token mode), as tests'
    from tests.cluster._cluster import Cluster

    with Cluster(HOSTS, CORES, spark=engine == "spark", ray=engine == "ray") as started:
        print(f"chaos: {engine} on {HOSTS} hosts x {CORES} slots up in "
              f"{started.start_seconds:.1f} s", flush=True)  # fmt: skip
        yield started


def address(started: Any) -> dict[str, Any]:
    """What the run's driver (the bench's child process) needs to reach the cluster: the
    attributes of `Cluster` that tests/cluster's `spark_session_on` and `connect_ray` read."""
    where = {"driver_address": started.driver_address, "cores": CORES, "count": HOSTS}
    if started.spark is not None:
        where["spark_master"] = started.spark_master
    if started.ray is not None:
        where["ray_address"] = started.ray_address
    return where


def connect(engine: str, where: dict[str, Any]) -> None:
    """In the driver: a SparkSession on the cluster with every executor registered, or this
    process connected to its Ray head with every CPU free (tests/cluster's own fixtures)."""
    from tests.cluster import conftest

    seen = types.SimpleNamespace(**where)
    if engine == "spark":
        conftest.spark_session_on(seen)
    else:
        conftest.connect_ray(seen)


def ranks_by_host(started: Any) -> list[list[Any]]:
    """The live rank processes (`hora.rank.worker`) on each host, a list per host."""
    import psutil  # type: ignore[import-untyped]

    found = []
    for host in started.hosts:
        ranks = []
        for pid in started.network.pids(host):
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                if p.status() != psutil.STATUS_ZOMBIE and "hora.rank.worker" in " ".join(
                    p.cmdline()
                ):
                    ranks.append(p)
        found.append(ranks)
    return found


def victims(started: Any, kill: str) -> list[list[Any]]:
    """What the chaos may kill at once: one rank (`kill` "rank") or every rank of one host."""
    by_host = ranks_by_host(started)
    if kill == "host":
        return [ranks for ranks in by_host if ranks]
    return [[p] for ranks in by_host for p in ranks]
