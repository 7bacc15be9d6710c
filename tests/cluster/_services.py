"""Spark standalone and Ray on the namespaced hosts: a master (head) on the bridge, one worker
(node) per host.

Every process starts with a clean environment (`clean_env`): CI exports SPARK_LOCAL_IP=127.0.0.1,
MASTER_ADDR=127.0.0.1 and GLOO_SOCKET_IFNAME=lo for the one-machine tests, and any of them leaking
into a namespaced host would bind its executors, or gloo, to that host's loopback.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from tests.cluster._hosts import TAG, Host, Network, kill_all

# What a cluster process keeps from the environment it is started from: nothing that says where
# to bind or which interface to use. Ray's token settings must match the driver's.
KEPT = ("HOME", "LANG", "LC_ALL", "TZ", "JAVA_HOME", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
READY_SECONDS = 120.0
SPARK_DAEMON_MEMORY = "256m"
WORKER_MEMORY_MB = 1024  # what executors may take on each host (the session asks 512m)
RAY_OBJECT_STORE_BYTES = 100 * 1024 * 1024  # about Ray's minimum


def clean_env(prefix: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every cluster process starts with: this Python's folder on a system
    PATH, the slot's tag, the KEPT variables, and `extra`."""
    env = {name: os.environ[name] for name in KEPT if name in os.environ}
    env |= {
        "PATH": os.path.dirname(sys.executable) + os.pathsep + SYSTEM_PATH,
        TAG: prefix,
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONUNBUFFERED": "1",
    }
    return env | dict(extra or {})


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def wait_for_line(log: Path, text: str, proc: subprocess.Popen, what: str) -> None:
    """Until `text` appears in `log`; a process that ends first, or a wait past READY_SECONDS,
    raises with the log's tail."""
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no output)"
    state = f"exited with {proc.returncode}" if proc.poll() is not None else "not ready in time"
    raise RuntimeError(f"{what} {state}; the end of {log}:\n{tail}")


class SparkStandalone:
    """A Spark master on the bridge address and one worker per host (`cores` each)."""

    def __init__(self, network: Network, env: Mapping[str, str], cores: int):
        from pyspark.find_spark_home import _find_spark_home

        self.network = network
        self.cores = cores
        self.folder = network.slot.folder / "spark"
        self.spark_class = str(Path(_find_spark_home()) / "bin" / "spark-class")
        conf = self.folder / "conf"  # empty: no spark-defaults.conf or spark-env.sh of the user
        conf.mkdir(parents=True, exist_ok=True)
        self.env = dict(env) | {
            "SPARK_CONF_DIR": str(conf),
            "SPARK_DAEMON_MEMORY": SPARK_DAEMON_MEMORY,
            "SPARK_LOG_DIR": str(self.folder / "logs"),
        }
        address = network.driver_address
        self.port = free_port(address)
        self.master_url = f"spark://{address}:{self.port}"
        self.master: subprocess.Popen | None = None
        self.workers: dict[str, subprocess.Popen] = {}

    def log(self, name: str) -> Path:
        return self.folder / f"{name}.log"

    def start(self) -> None:
        address = self.network.driver_address
        argv = [self.spark_class, "org.apache.spark.deploy.master.Master", "--host", address]
        argv += ["--port", str(self.port), "--webui-port", str(free_port(address))]
        log = self.log("master")
        with open(log, "ab") as out:
            self.master = subprocess.Popen(
                argv,
                env=self.env | {"SPARK_LOCAL_IP": address},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        wait_for_line(log, "New state: ALIVE", self.master, "the Spark master")
        for host in self.network.hosts:
            self.start_on(host, wait=False)
        for host in self.network.hosts:
            self.wait_on(host)

    def start_on(self, host: Host, wait: bool = True) -> None:
        """Start (or start again, after the host vanished) the Spark worker of `host`."""
        work = self.folder / host.name / "work"
        work.mkdir(parents=True, exist_ok=True)
        argv = [self.spark_class, "org.apache.spark.deploy.worker.Worker", "--host", host.address]
        argv += ["--cores", str(self.cores), "--memory", f"{WORKER_MEMORY_MB}m"]
        argv += ["--work-dir", str(work), "--webui-port", "8081", self.master_url]
        env = self.env | {"SPARK_LOCAL_IP": host.address, "SPARK_LOCAL_DIRS": str(work)}
        log = self.log(f"worker-{host.name}")
        log.unlink(missing_ok=True)  # a restarted worker's readiness is its own line
        self.workers[host.name] = self.network.popen(host, argv, env, log)
        if wait:
            self.wait_on(host)

    def wait_on(self, host: Host) -> None:
        wait_for_line(
            self.log(f"worker-{host.name}"),
            "Successfully registered with master",
            self.workers[host.name],
            f"the Spark worker on {host.name}",
        )

    def alive_on(self, host: Host) -> bool:
        return self.workers[host.name].poll() is None

    def stop_on(self, host: Host) -> None:
        kill_all([self.workers[host.name].pid])
        self.workers[host.name].wait(timeout=10)

    def stop(self) -> None:
        kill_all([p.pid for p in self.workers.values()])
        if self.master is not None:
            kill_all([self.master.pid])
        for proc in [*self.workers.values(), self.master]:
            if proc is not None:
                proc.wait(timeout=10)


class RayCluster:
    """A Ray head on the bridge address (no CPUs: no rank lands on the driver's machine) and
    one Ray node per host (`cores` CPUs each); no dashboard, a small object store."""

    def __init__(self, network: Network, env: Mapping[str, str], cores: int):
        self.network = network
        self.cores = cores
        self.env = dict(env)
        self.folder = network.slot.folder / "ray"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port(network.driver_address)
        self.address = f"{network.driver_address}:{self.port}"
        self.head: subprocess.Popen | None = None
        self.nodes: dict[str, subprocess.Popen] = {}
        self._ray = os.path.join(os.path.dirname(sys.executable), "ray")

    def _argv(self, address: str, cpus: int, temp: str) -> list[str]:
        """`ray start`'s options for a node; each node has a temp folder of its own (nodes
        started at once in one folder race for the same socket names)."""
        return [
            self._ray,
            "start",
            "--block",
            f"--node-ip-address={address}",
            f"--num-cpus={cpus}",
            "--num-gpus=0",
            f"--object-store-memory={RAY_OBJECT_STORE_BYTES}",
            f"--temp-dir={self.folder / temp}",
            "--disable-usage-stats",
        ]

    def start(self) -> None:
        address = self.network.driver_address
        argv = [*self._argv(address, 0, "head"), "--head", f"--port={self.port}"]
        argv += ["--include-dashboard=false"]
        # Not Ray's fixed defaults, which another Ray on this machine may hold.
        for option in ("--ray-client-server-port", "--dashboard-agent-listen-port"):
            argv.append(f"{option}={free_port(address)}")
        argv.append(f"--dashboard-port={free_port('127.0.0.1')}")  # its minimal head binds it
        log = self.folder / "head.log"
        with open(log, "ab") as out:
            self.head = subprocess.Popen(
                argv,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        wait_for_line(log, "Ray runtime started", self.head, "the Ray head")
        for host in self.network.hosts:
            self.start_on(host, wait=False)
        for host in self.network.hosts:
            self.wait_on(host)

    def start_on(self, host: Host, wait: bool = True) -> None:
        argv = [*self._argv(host.address, self.cores, host.name), f"--address={self.address}"]
        log = self.folder / f"node-{host.name}.log"
        log.unlink(missing_ok=True)
        self.nodes[host.name] = self.network.popen(host, argv, self.env, log)
        if wait:
            self.wait_on(host)

    def wait_on(self, host: Host) -> None:
        log = self.folder / f"node-{host.name}.log"
        proc = self.nodes[host.name]
        wait_for_line(log, "Ray runtime started", proc, f"the Ray node on {host.name}")

    def alive_on(self, host: Host) -> bool:
        return self.nodes[host.name].poll() is None

    def stop_on(self, host: Host) -> None:
        """SIGTERM first: `ray start --block` then drains the node and unregisters it."""
        kill_all([self.nodes[host.name].pid])
        self.nodes[host.name].wait(timeout=10)

    def stop(self) -> None:
        kill_all([p.pid for p in self.nodes.values()])
        if self.head is not None:
            kill_all([self.head.pid])
        for proc in [*self.nodes.values(), self.head]:
            if proc is not None:
                proc.wait(timeout=10)
