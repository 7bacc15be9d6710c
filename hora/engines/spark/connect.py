"""hora's stage on a Spark Connect session (Databricks Connect, `SparkSession.builder.remote`).

A Connect client has no SparkContext and no JVM: the barrier stage is a DataFrame,
`spark.range(np, numPartitions=np).mapInArrow(task, schema, barrier=True)` (what pyspark's own
TorchDistributor runs there), started in a thread that carries the caller's tags, and cancelled
by hora's own tag (`interruptTag`; never `interruptAll`, which would end the user's queries too).
Tags live per thread in the client, so the tag is added inside the stage's thread.

What differs from a classic session, and is said rather than guessed:
- the executors' Python is the Connect server's (PYSPARK_PYTHON in the server's environment);
  a client cannot choose it per stage;
- slots are counted from the master and the static settings (`slots_from_settings`); where those
  do not tell (a cluster manager that sizes executors itself), they cannot be counted, and the
  run's `start_timeout` ends a stage that waits for slots that never come;
- the tasks must reach the client, which may be far from the cluster (`default_channel_host`).

pyspark is imported where a stage starts, so that finding no session loads none of it.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import threading
from collections.abc import Callable, Mapping
from functools import cached_property, partial
from typing import Any, Literal

from hora.engines.spark import entry
from hora.engines.spark.base import Session
from hora.engines.spark.checks import runs_on_this_machine

#: the first Spark with barrier mapInArrow (SPARK-42993), which hora's stage is on Connect
MIN_SERVER = (3, 5)
#: what each task yields: its partition and how its rank ended (Arrow types must match exactly)
STAGE_SCHEMA = "task long, outcome string"
_LOCAL = re.compile(r"local(?:\[(\d+|\*)(?:,\s*\d+)?\])?$")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]$")


class ConnectSession(Session):
    """A Spark Connect client's SparkSession."""

    kind: Literal["classic", "connect"] = "connect"

    def __init__(self, spark: Any):
        self.spark = spark
        self._settings: dict[str, str | None] = {}  # each read is a round trip to the server

    @cached_property
    def master(self) -> str:
        return self.conf("spark.master", "")

    def conf(self, key: str, default: str = "") -> str:
        if key not in self._settings:
            self._settings[key] = self.spark.conf.get(key, None)
        return self._settings[key] or default

    def check(self) -> None:
        check_version(self.spark.version)

    def driver_gpus(self, resource: str = "gpu") -> list[str] | None:
        """The server driver's GPU resources, as pyspark's TorchDistributor reads them."""
        try:
            resources = self.spark._client._resources()
        except Exception:  # a client without that call: say none, as for a driver without GPUs
            return None
        return list(resources[resource].addresses) if resource in resources else None

    def slots(self) -> int | None:
        return slots_from_settings(self.master, self.conf, in_this_process=_server_here())

    def executors(self) -> int | None:
        found = _LOCAL_CLUSTER.match(self.master)
        if found:
            return int(found[1])
        instances = self.conf("spark.executor.instances")
        return int(instances) if instances.isdigit() else None

    def default_channel_host(self) -> str:
        """This machine's address on its route to the Connect server; on a route over loopback
        (client and server on one machine) 127.0.0.1 when the executors are on it too, else the
        server driver's host (the client runs on the driver node, as a notebook there does)."""
        route = address_towards(self.spark.client.host)
        if not ipaddress.ip_address(route.split("%", 1)[0]).is_loopback:
            return route
        if runs_on_this_machine(self.master):
            return "127.0.0.1"
        return self.conf("spark.driver.host", "127.0.0.1")

    def thread(self, target: Callable[[], None], name: str) -> threading.Thread:
        from pyspark import InheritableThread  # carries the caller's tags (session= on Connect)

        return InheritableThread(target, session=self.spark, name=name)

    def run_barrier(
        self, np: int, driver: dict[str, str], spec: Mapping[str, Any], tag: str
    ) -> Any:
        from pyspark import cloudpickle as spark_cloudpickle

        spark = self.spark
        spark.addTag(tag)  # in this thread: tags are per thread in a Connect client
        try:
            # By value: the check must load on an executor whose Python lacks hora.
            spark_cloudpickle.register_pickle_by_value(entry)
            task = partial(entry.run_task_arrow, driver, dict(spec))
            stage = spark.range(np, numPartitions=np).mapInArrow(task, STAGE_SCHEMA, barrier=True)
            return stage.collect()
        finally:
            spark.removeTag(tag)

    def cancel(self, tag: str) -> None:
        self.spark.interruptTag(tag)


def check_version(version: str) -> None:
    """Refuse a Connect server that cannot run a barrier stage through mapInArrow."""
    numbers = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    if numbers < MIN_SERVER:
        raise RuntimeError(
            f"this Spark Connect server runs Spark {version}, and hora's Spark engine needs "
            f"Spark {'.'.join(map(str, MIN_SERVER))} or later on a Spark Connect server (barrier "
            "mapInArrow, SPARK-42993). Upgrade the server (on Databricks: Databricks Runtime "
            "14.0 or later), or run on a classic SparkSession."
        )


def slots_from_settings(
    master: str, conf: Callable[[str, str], str], in_this_process: bool = False
) -> int | None:
    """How many tasks can run at once (cores only), from the master URL and the static
    settings, or None when they do not tell: `local[N]`, `local-cluster[n,c,m]`, and a fixed
    number of executors with their cores set. `local[*]` counts this machine's cores when the
    server runs in this process (`remote("local[*]")`)."""
    task_cpus = max(1, _int(conf("spark.task.cpus", "1")) or 1)
    if found := _LOCAL.match(master):
        cores = found[1] or "1"
        if cores == "*":
            return (os.cpu_count() or 1) // task_cpus if in_this_process else None
        return int(cores) // task_cpus
    if found := _LOCAL_CLUSTER.match(master):
        return int(found[1]) * (int(found[2]) // task_cpus)
    if conf("spark.dynamicAllocation.enabled", "false").strip().lower() == "true":
        return None
    instances = _int(conf("spark.executor.instances", ""))
    cores = _int(conf("spark.executor.cores", ""))
    if instances is None or cores is None:
        return None
    slots = instances * (cores // task_cpus)
    gpus_per_task = _float(conf("spark.task.resource.gpu.amount", "0"))
    if gpus_per_task > 0:
        per_executor = _float(conf("spark.executor.resource.gpu.amount", "0"))
        slots = min(slots, instances * int(per_executor // gpus_per_task))
    return slots


def address_towards(host: str) -> str:
    """This machine's address on its route to `host`: a UDP socket's connect() picks the
    interface, and sends nothing."""
    family, kind, _, _, where = socket.getaddrinfo(host, 15002, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, kind) as probe:
        probe.connect(where)
        return str(probe.getsockname()[0])


def _server_here() -> bool:
    """Whether the Connect server runs in this process (pyspark's `remote("local[N]")`)."""
    return os.environ.get("SPARK_LOCAL_REMOTE") == "1"


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0
