"""A driver SIGKILLed mid-run (issue 39, item 5), on every engine.

No code of the driver runs when it is SIGKILLed: each rank must notice by itself (it watches the
driver's channel and kills its own process group when the channel closes, hora.rank.worker), in
far less than the heartbeat silence time (hora.job.silence), and what the engine started for the
run (Spark's executors and Python workers, Ray's actors) must end with it.

Each engine's test starts this module as the driver, `python -m tests._driver_death ENGINE
FOLDER ...` (`start_driver`), with a tag of its own in its environment; waits until every rank
wrote what it is (`wait_for_ranks`: the rank's pid, a child it started, its parent, its host,
the shared memory it mapped); SIGKILLs the driver; and measures how long until every one of them
is gone (`kill_and_time`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from hora.job.silence import DEFAULT_SILENCE_SECONDS
from tests._procs import pids_with_env

ROOT = str(Path(__file__).resolve().parents[1])
DRIVER_TAG = "HORA_TEST_DRIVER"  # a killed driver's own tag: what it started, wherever it runs
GONE_SECONDS = 10.0  # the ranks of a killed driver must be gone within this
START_SECONDS = 120.0  # for a driver to start its ranks (a JVM, a Spark local-cluster)
SPARK_EXECUTOR = b"org.apache.spark.executor.CoarseGrainedExecutorBackend"
assert GONE_SECONDS < DEFAULT_SILENCE_SECONDS  # they see a closed channel, not a silence


# ----- the ranks -------------------------------------------------------------------------------
def rank_waits(folder: str) -> None:
    """hora.torch's init (the ranks of a host meet in a shared-memory segment), a child in the
    rank's process group, then this rank's record in `folder`, then a long sleep."""
    import torch

    import hora.torch as hvd

    hvd.init()
    hvd.allreduce(torch.ones(1 << 10), name="warm")
    child = subprocess.Popen(["sleep", "3600"])
    maps = Path("/proc/self/maps").read_text()
    shm = sorted({line.split()[5] for line in maps.splitlines() if "/dev/shm/hora-" in line})
    record = {
        "rank": hvd.rank(),
        "pid": os.getpid(),
        "child": child.pid,
        "parent": os.getppid(),
        "host": socket.gethostname(),
        "shm": shm,
    }
    path = Path(folder, f"rank-{hvd.rank()}")
    path.with_suffix(".tmp").write_text(json.dumps(record))
    path.with_suffix(".tmp").rename(path)  # whole, or not there
    time.sleep(3600)


# ----- the driver ------------------------------------------------------------------------------
def main(engine: str, folder: str, *args: str) -> None:
    """The driver: `local`; `spark MASTER NP [CONF_JSON]` (a SparkSession of its own on MASTER);
    `ray ADDRESS` (connected to a running Ray head)."""
    import hora

    if engine == "local":
        hora.run(rank_waits, (folder,), np=2)
    elif engine == "spark":
        from tests.spark.conftest import start_spark

        master, np = args[0], int(args[1])
        conf = json.loads(args[2]) if len(args) > 2 else {}
        # What the executors start (on a cluster's hosts too) carries the driver's tag.
        conf[f"spark.executorEnv.{DRIVER_TAG}"] = os.environ[DRIVER_TAG]
        start_spark(master, **conf)
        hora.run(rank_waits, (folder,), np=np, backend="spark")
    elif engine == "ray":
        import ray

        ray.init(address=args[0], log_to_driver=False)
        hora.run(rank_waits, (folder,), np=2, backend="ray")
    else:
        raise ValueError(engine)


# ----- the test's side -------------------------------------------------------------------------
@dataclass
class Driver:
    proc: subprocess.Popen
    folder: Path
    tag: str  # DRIVER_TAG's value in its environment

    @property
    def log(self) -> Path:
        return self.folder / "driver.log"

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    def tagged(self) -> list[int]:
        """Live processes (zombies aside) that carry this driver's tag."""
        return pids_with_env(DRIVER_TAG, self.tag, zombies=False)

    def executors(self) -> list[int]:
        """Its Spark executor JVMs (a local-cluster's, or on a cluster's hosts)."""
        return [pid for pid in self.tagged() if SPARK_EXECUTOR in cmdline(pid)]

    def stop(self) -> None:
        """Kill it (if the test has not), reap it, and kill whatever of its tag is left: the
        test fails on what it finds left, and leaves nothing running."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        _kill({pid: _started(pid) for pid in self.tagged()})


def start_driver(folder: Path, *args: str, env: dict[str, str] | None = None) -> Driver:
    """The driver (`main(*args)`) in a process of its own, its output in FOLDER/driver.log."""
    tag = uuid.uuid4().hex
    environ = dict(os.environ if env is None else env) | {DRIVER_TAG: tag}
    with open(folder / "driver.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests._driver_death", *args],
            cwd=ROOT,
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return Driver(proc, folder, tag)


def wait_for_ranks(driver: Driver, np: int, seconds: float = START_SECONDS) -> list[dict]:
    """Every rank's record, once all `np` are written (the ranks then sleep in the job)."""
    deadline = time.monotonic() + seconds
    while len(found := sorted(driver.folder.glob("rank-*"))) < np:
        if driver.proc.poll() is not None:
            code = driver.proc.returncode
            raise AssertionError(f"the driver ended first ({code}):\n{driver.tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(found)} of {np} ranks after {seconds} s:\n{driver.tail()}")
        time.sleep(0.05)
    return [json.loads(p.read_text()) for p in found]


def cmdline(pid: int) -> bytes:
    """The process's command line, its arguments apart by NULs; empty once it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _started(pid: int) -> str | None:
    """The process's start time (in clock ticks since boot), None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == b"Z" else fields[19].decode()


def running(pids: Iterable[int]) -> dict[int, str]:
    """Each of these live processes with its start time, to tell it from a later one that gets
    its pid."""
    found = {pid: _started(pid) for pid in pids}
    assert None not in found.values(), f"not all alive: {found}"
    return cast(dict[int, str], found)


def still_running(processes: dict[int, str]) -> list[int]:
    """Those of `running`'s processes that are still there (a zombie is gone)."""
    return [pid for pid, started in processes.items() if _started(pid) == started]


def kill_and_time(driver: Driver, pids: Iterable[int], seconds: float = GONE_SECONDS) -> float:
    """SIGKILL the driver; the seconds until every one of `pids` (alive now) is gone. Raises,
    naming the survivors (killed then), after `seconds`."""
    processes = running(pids)
    killed = time.monotonic()
    driver.proc.kill()
    while left := still_running(processes):
        took = time.monotonic() - killed
        if took > seconds:
            _kill(processes)  # a failed test leaves nothing running
            raise AssertionError(f"alive {took:.1f} s after the driver was killed: {left}")
        time.sleep(0.02)
    took = time.monotonic() - killed
    driver.proc.wait(timeout=30)
    return took


def _kill(processes: dict[int, str | None]) -> None:
    """SIGKILL each of these processes that is still the one that started at that time."""
    for pid, started in processes.items():
        if started is not None and _started(pid) == started:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def wait_until_gone(find: Callable[[], list], seconds: float) -> tuple[float, list]:
    """How long until `find()` returns nothing (from now), and what it returned last."""
    began = time.monotonic()
    while (left := find()) and time.monotonic() - began < seconds:
        time.sleep(0.05)
    return time.monotonic() - began, left


def hora_segments(folder: str = "/dev/shm") -> set[str]:
    """hora's shared-memory segments in `folder` (named hora-<run token>-<host>)."""
    return {name for name in os.listdir(folder) if name.startswith("hora")}


def segments_left(ranks: list[dict]) -> list[str]:
    """The shared-memory segments the ranks mapped (on this machine) that are still there."""
    return [path for r in ranks for path in r["shm"] if os.path.exists(path)]


if __name__ == "__main__":
    from tests._driver_death import main as imported  # the job then pickles by reference

    imported(*sys.argv[1:])
