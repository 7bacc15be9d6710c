"""A whole test cluster as one object: the namespaced hosts, and Spark and/or Ray on them.

    with Cluster(hosts=2, cores=2, spark=True, ray=True) as cluster:
        cluster.spark_master   # spark://10.213.57.1:PORT
        cluster.ray_address    # 10.213.57.1:PORT
        cluster.cut_off("host2"); cluster.restore("host2")
        cluster.shape(Shape("1gbit", delay_ms=0.2)); cluster.clear_shape()
        cluster.shape(Shape(loss_pct=5), ["host2"]); cluster.lost("host2")

`stop()` removes everything (processes, namespaces, bridge, /etc/netns files, qdiscs, nftables
tables), and runs however `start()` or the test ended: on an exception, at interpreter exit, and
on SIGTERM.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import threading
import time
from collections.abc import Mapping
from types import FrameType
from typing import Any

from tests.cluster._hosts import (
    ClusterUnavailable,
    Host,
    Network,
    Shape,
    claim_slot,
    why_unavailable,
)
from tests.cluster._services import RayCluster, SparkStandalone, clean_env


class Cluster:
    """`hosts` namespaced hosts with `cores` Spark cores and Ray CPUs each."""

    def __init__(
        self,
        hosts: int = 2,
        cores: int = 2,
        *,
        spark: bool = True,
        ray: bool = False,
        extra_env: Mapping[str, str] | None = None,
    ):
        self.count = hosts
        self.cores = cores
        self.want_spark = spark
        self.want_ray = ray
        self.extra_env = dict(extra_env or {})
        self.network: Network | None = None
        self.spark: SparkStandalone | None = None
        self.ray: RayCluster | None = None
        self.start_seconds = 0.0
        self.stop_seconds = 0.0
        self.was_cut: set[str] = set()  # hosts cut off since the last make_whole
        self._slot: Any = None
        self._previous_sigterm: Any = None

    # -- life --------------------------------------------------------------------------------
    def start(self) -> Cluster:
        reason = why_unavailable()
        if reason:
            raise ClusterUnavailable(reason)
        began = time.monotonic()
        self._slot = claim_slot()
        atexit.register(self.stop)
        self._stop_on_sigterm()
        try:
            env = clean_env(self._slot.prefix, self.extra_env)
            self._slot.folder.mkdir(parents=True, exist_ok=True)
            self.network = Network(self._slot, self.count, env)
            self.network.start()
            if self.want_spark:
                self.spark = SparkStandalone(self.network, env, self.cores)
            if self.want_ray:
                self.ray = RayCluster(self.network, env, self.cores)
            self._start_services()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def _start_services(self) -> None:
        """Each service's root (master, head), each started on every host as soon as its root
        is ready, and waited for together: Spark's workers boot while Ray's head starts, and both
        engines' hosts at once (seconds of a start on 2 cores)."""
        for service in self.services:
            service.start_root()
            for host in self.hosts:
                service.start_on(host, wait=False)
        for service in self.services:
            for host in self.hosts:
                service.wait_on(host)

    def stop(self) -> None:
        """Remove everything; a second call does nothing."""
        if self._slot is None:
            return
        began = time.monotonic()
        try:
            for service in (self.ray, self.spark):
                if service is not None:
                    with contextlib.suppress(Exception):
                        service.stop()
            if self.network is not None:
                self.network.stop()
        finally:
            self._slot.release()
            self._slot = None
            atexit.unregister(self.stop)
            if self._previous_sigterm is not None and _main_thread():
                signal.signal(signal.SIGTERM, self._previous_sigterm)
            self.stop_seconds = time.monotonic() - began

    def _stop_on_sigterm(self) -> None:
        """A SIGTERM (a CI job cancelled) ends the program through its `finally`s and fixtures'
        teardown, as Ctrl-C does, instead of leaving the cluster up."""
        if not _main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return

        def interrupt(signum: int, frame: FrameType | None) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        self._previous_sigterm = signal.signal(signal.SIGTERM, interrupt)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- where things are --------------------------------------------------------------------
    @property
    def hosts(self) -> list[Host]:
        assert self.network is not None, "the cluster is not started"
        return self.network.hosts

    def host(self, name: str) -> Host:
        """A host by hostname, address or namespace."""
        assert self.network is not None, "the cluster is not started"
        return self.network.host(name)

    @property
    def driver_address(self) -> str:
        assert self.network is not None, "the cluster is not started"
        return self.network.driver_address

    @property
    def spark_master(self) -> str:
        assert self.spark is not None, "this cluster runs no Spark"
        return self.spark.master_url

    @property
    def ray_address(self) -> str:
        assert self.ray is not None, "this cluster runs no Ray"
        return self.ray.address

    # -- faults and shapes -------------------------------------------------------------------
    @property
    def services(self) -> list[SparkStandalone | RayCluster]:
        return [s for s in (self.spark, self.ray) if s is not None]

    def cut_off(self, name: str) -> None:
        """The host's veth goes down: it and its processes live on, unreachable."""
        assert self.network is not None
        self.network.cut_off(self.host(name))
        self.was_cut.add(name)

    def restore(self, name: str) -> None:
        """The host's veth comes up again (what timed out meanwhile stays so: `make_whole`)."""
        assert self.network is not None
        self.network.restore(self.host(name))

    def kill_host(self, name: str) -> list[int]:
        """The host vanishes: every process on it (Spark worker, executors, Ray node, ranks)
        is SIGKILLed; `make_whole` starts its services again."""
        assert self.network is not None
        return self.network.kill_host(self.host(name))

    def make_whole(self) -> None:
        """After a fault: every link up and unshaped; every host that was cut off starts again
        from nothing (its services stopped, whatever they left killed, started again); every
        service that is down on a host is started again. Returns once they are ready; what
        the driver sees of them (slots, nodes) is the caller's to wait for."""
        assert self.network is not None
        self.clear_shape()
        for host in self.hosts:
            self.restore(host.name)
        for name in sorted(self.was_cut):
            host = self.host(name)
            for service in self.services:
                service.stop_on(host)
            self.network.kill_host(host)
        self.was_cut.clear()
        down = [(s, h) for h in self.hosts for s in self.services if not s.alive_on(h)]
        for service, host in down:  # started together (a host's Spark worker and Ray node)
            service.start_on(host, wait=False)
        for service, host in down:
            service.wait_on(host)

    def shape(self, shape: Shape, hosts: list[str] | None = None) -> None:
        """Shape both directions of the named hosts' links (every host's by default)."""
        assert self.network is not None
        chosen = [self.host(n) for n in hosts] if hosts else None
        self.network.shape(shape, chosen)

    def clear_shape(self) -> None:
        assert self.network is not None
        self.network.clear_shape()

    def lost(self, name: str) -> tuple[int, int]:
        """(packets, of them dropped) on the host's lossy link, both ways, since it was shaped."""
        assert self.network is not None
        return self.network.lost(self.host(name))


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
