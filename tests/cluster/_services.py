"""Spark standalone and Ray on the namespaced hosts: a master (head) on the bridge, one worker
(node) per host.

Every process starts with a clean environment (`clean_env`): CI exports SPARK_LOCAL_IP=127.0.0.1,
MASTER_ADDR=127.0.0.1 and GLOO_SOCKET_IFNAME=lo for the one-machine tests, and any of them leaking
into a namespaced host would bind its executors, or gloo, to that host's loopback.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from tests.cluster._hosts import TAG, Host, Network, kill_all, popen_logged

# What a cluster process keeps from the environment it is started from: nothing that says where
# to bind or which interface to use. Ray's token settings must match the driver's.
KEPT = ("HOME", "LANG", "LC_ALL", "TZ", "JAVA_HOME", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The checkout under test: the hosts import hora (and tests' jobs) from it, not from wherever the
# venv's editable install points (another worktree's checkout, on a machine with several).
CHECKOUT = str(Path(__file__).resolve().parents[2])
READY_SECONDS = 120.0
SPARK_DAEMON_MEMORY = "256m"
WORKER_MEMORY_MB = 1024  # what executors may take on each host (the session asks 512m)
RAY_OBJECT_STORE_BYTES = 100 * 1024 * 1024  # about Ray's minimum
# The master declares a silent worker lost after this (Spark's default is 60 s, checked every
# 15 s: 45 to 75 s after a host is cut off). Longer, so that a test of hora's own detection of a
# silent peer (within 60 s) cannot pass by Spark's, now and then; a killed worker is seen at once.
WORKER_TIMEOUT_SECONDS = 90


def clean_env(prefix: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every cluster process starts with: this Python's folder on a system
    PATH, the checkout under test first on PYTHONPATH, the slot's tag, the KEPT variables, and
    `extra`."""
    env = {name: os.environ[name] for name in KEPT if name in os.environ}
    env |= {
        "PATH": os.path.dirname(sys.executable) + os.pathsep + SYSTEM_PATH,
        TAG: prefix,
        "RAY_USAGE_STATS_ENABLED": "0",
        # Explicit on every Ray process: unset, a head enables tokens when ~/.ray/auth_token
        # exists while nodes and drivers do not. Unset here means what it means to a driver.
        "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": CHECKOUT,
    }
    return env | dict(extra or {})


def ray_token() -> str:
    """The token Ray reads when no variable names one: its file, made as Ray's own `ray.init`
    makes it when missing (a fresh machine has none, and `ray start --head` makes none)."""
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_hex(32))
    return path.read_text().strip()


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


class _Service:
    """One process on the bridge address (a master, a head) and one on each host (workers,
    nodes): started together, and on one host alone again after a fault."""

    what = "service"  # what runs on each host, for messages
    ready_line = ""  # what its log says once it is ready
    folder_name = ""  # its folder (logs, work) in the slot's

    def __init__(self, network: Network, env: Mapping[str, str], cores: int):
        self.network = network
        self.cores = cores
        self.env = dict(env)
        self.folder = network.slot.folder / self.folder_name
        self.folder.mkdir(parents=True, exist_ok=True)
        self.root: subprocess.Popen | None = None
        self.on_hosts: dict[str, subprocess.Popen] = {}

    def start_root(self) -> None:
        """The process on the bridge address, ready; the hosts' are `start_on`'s."""
        raise NotImplementedError

    def _host_argv(self, host: Host) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def log(self, name: str) -> Path:
        return self.folder / f"{name}.log"

    def start_on(self, host: Host, wait: bool = True) -> None:
        """Start (or start again, after a fault) this service's process on `host`."""
        argv, env = self._host_argv(host)
        log = self.log(host.name)
        log.unlink(missing_ok=True)  # a process started again: its readiness is its own line
        self.on_hosts[host.name] = self.network.popen(host, argv, env, log)
        if wait:
            self.wait_on(host)

    def wait_on(self, host: Host) -> None:
        what = f"the {self.what} on {host.name}"
        wait_for_line(self.log(host.name), self.ready_line, self.on_hosts[host.name], what)

    def alive_on(self, host: Host) -> bool:
        return self.on_hosts[host.name].poll() is None

    def stop_on(self, host: Host) -> None:
        """SIGTERM first (a Ray node then drains and unregisters), SIGKILL after a grace."""
        kill_all([self.on_hosts[host.name].pid])
        self.on_hosts[host.name].wait(timeout=10)

    def stop(self) -> None:
        kill_all([p.pid for p in self.on_hosts.values()])
        if self.root is not None:
            kill_all([self.root.pid])
        for proc in [*self.on_hosts.values(), self.root]:
            if proc is not None:
                proc.wait(timeout=10)


class SparkStandalone(_Service):
    """A Spark master on the bridge address and one worker per host (`cores` each)."""

    what = "Spark worker"
    ready_line = "Successfully registered with master"
    folder_name = "spark"

    def __init__(self, network: Network, env: Mapping[str, str], cores: int):
        from pyspark.find_spark_home import _find_spark_home  # pyspark: only for Spark

        super().__init__(network, env, cores)
        self.spark_class = str(Path(_find_spark_home()) / "bin" / "spark-class")
        conf = self.folder / "conf"  # empty: no spark-defaults.conf or spark-env.sh of the user
        conf.mkdir(parents=True, exist_ok=True)
        self.env |= {
            "SPARK_CONF_DIR": str(conf),
            "SPARK_DAEMON_MEMORY": SPARK_DAEMON_MEMORY,
            # C1 only, as every Spark of the suite (tests/spark_conf/spark-defaults.conf says why)
            "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1",
            "SPARK_LOG_DIR": str(self.folder / "logs"),
        }
        address = network.driver_address
        self.port = free_port(address)
        self.master_url = f"spark://{address}:{self.port}"

    def start_root(self) -> None:
        address = self.network.driver_address
        argv = [self.spark_class, "org.apache.spark.deploy.master.Master", "--host", address]
        argv += ["--port", str(self.port), "--webui-port", str(free_port(address))]
        env = self.env | {
            "SPARK_LOCAL_IP": address,
            "SPARK_MASTER_OPTS": f"-Dspark.worker.timeout={WORKER_TIMEOUT_SECONDS}",
        }
        log = self.log("master")
        self.root = popen_logged(argv, env, log)
        wait_for_line(log, "New state: ALIVE", self.root, "the Spark master")

    def _host_argv(self, host: Host) -> tuple[list[str], dict[str, str]]:
        work = self.folder / host.name
        work.mkdir(parents=True, exist_ok=True)
        argv = [self.spark_class, "org.apache.spark.deploy.worker.Worker", "--host", host.address]
        argv += ["--cores", str(self.cores), "--memory", f"{WORKER_MEMORY_MB}m"]
        argv += ["--work-dir", str(work), "--webui-port", "8081", self.master_url]
        return argv, self.env | {"SPARK_LOCAL_IP": host.address, "SPARK_LOCAL_DIRS": str(work)}


class RayCluster(_Service):
    """A Ray head on the bridge address (no CPUs: no rank lands on the driver's machine) and
    one Ray node per host (`cores` CPUs each); no dashboard, a small object store."""

    what = "Ray node"
    ready_line = "Ray runtime started"
    folder_name = "ray"

    def __init__(self, network: Network, env: Mapping[str, str], cores: int):
        super().__init__(network, env, cores)
        self.port = free_port(network.driver_address)
        self.address = f"{network.driver_address}:{self.port}"

    def _argv(self, address: str, cpus: int, temp: str) -> list[str]:
        """`ray start`'s options for a node; each node has a temp folder of its own (nodes
        started at once in one folder race for the same socket names)."""
        ray = os.path.join(os.path.dirname(sys.executable), "ray")
        return [
            ray,
            "start",
            "--block",
            f"--node-ip-address={address}",
            f"--num-cpus={cpus}",
            "--num-gpus=0",
            f"--object-store-memory={RAY_OBJECT_STORE_BYTES}",
            f"--temp-dir={self.folder / temp}",
            "--disable-usage-stats",
        ]

    def start_root(self) -> None:
        if self.env.get("RAY_AUTH_MODE") == "token" and not self.env.get("RAY_AUTH_TOKEN"):
            ray_token()  # a head in token mode refuses to start without one (Ray >= 2.5x)
        address = self.network.driver_address
        argv = [*self._argv(address, 0, "head"), "--head", f"--port={self.port}"]
        argv += ["--include-dashboard=false"]
        # Not Ray's fixed defaults, which another Ray on this machine may hold.
        for option in ("--ray-client-server-port", "--dashboard-agent-listen-port"):
            argv.append(f"{option}={free_port(address)}")
        argv.append(f"--dashboard-port={free_port('127.0.0.1')}")  # its minimal head binds it
        log = self.log("head")
        self.root = popen_logged(argv, self.env, log)
        wait_for_line(log, self.ready_line, self.root, "the Ray head")

    def _host_argv(self, host: Host) -> tuple[list[str], dict[str, str]]:
        argv = [*self._argv(host.address, self.cores, host.name), f"--address={self.address}"]
        return argv, self.env
