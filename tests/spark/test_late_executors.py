"""A launch on a Spark cluster whose executors are still registering waits for them, saying what
it waits for: a real standalone cluster on this machine (a master and two one-core workers, the
second started only once the run has begun waiting), where `np=2` used to be refused after 5 s
of a steady count of 1."""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import hora
from tests import _workers
from tests.cluster._hosts import popen_logged
from tests.cluster._services import free_port, wait_for_line
from tests.spark.conftest import start_spark, stop_spark

pytestmark = pytest.mark.spark

LOOPBACK = "127.0.0.1"
LATE_SECONDS = 8.0  # past the 5 s of a steady count after which the launch was refused


class Standalone:
    """A Spark standalone master on this machine and the workers started one by one."""

    def __init__(self, folder: Path) -> None:
        from pyspark.find_spark_home import _find_spark_home

        self.folder = folder
        self.spark_class = str(Path(_find_spark_home()) / "bin" / "spark-class")
        (folder / "conf").mkdir()
        self.env = dict(
            os.environ,
            SPARK_CONF_DIR=str(folder / "conf"),
            SPARK_LOG_DIR=str(folder),
            SPARK_DAEMON_MEMORY="256m",
            SPARK_LOCAL_IP=LOOPBACK,
        )
        self.procs: list[subprocess.Popen] = []
        self.url = f"spark://{LOOPBACK}:{free_port(LOOPBACK)}"
        port = self.url.rsplit(":", 1)[1]
        argv = [self.spark_class, "org.apache.spark.deploy.master.Master", "--host", LOOPBACK]
        argv += ["--port", port, "--webui-port", str(free_port(LOOPBACK))]
        self._start(argv, "master", "New state: ALIVE")

    def add_worker(self) -> None:
        name = f"worker-{len(self.procs)}"
        work = self.folder / name
        work.mkdir()
        argv = [self.spark_class, "org.apache.spark.deploy.worker.Worker", "--host", LOOPBACK]
        argv += ["--cores", "1", "--memory", "1024m", "--work-dir", str(work)]
        argv += ["--webui-port", str(free_port(LOOPBACK)), self.url]
        self._start(argv, name, "Successfully registered with master")

    def _start(self, argv: list[str], name: str, ready: str) -> None:
        log = self.folder / f"{name}.log"
        proc = popen_logged(argv, self.env, log)
        self.procs.append(proc)
        wait_for_line(log, ready, proc, f"the Spark {name}")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Standalone]:
    standalone = Standalone(tmp_path)
    try:
        standalone.add_worker()
        yield standalone
    finally:
        standalone.stop()


def test_a_launch_waits_for_executors_still_registering_saying_what_it_waits_for(cluster):
    session = start_spark(
        cluster.url, **{"spark.executor.cores": "1", "spark.executor.memory": "512m"}
    )
    said = io.StringIO()
    late = threading.Timer(LATE_SECONDS, cluster.add_worker)
    try:
        with contextlib.redirect_stderr(said):
            late.start()
            assert hora.run(_workers.rank_times, (3,), np=2, backend="spark") == [0, 3]
    finally:
        late.join()
        stop_spark(session)
    lines = [line for line in said.getvalue().splitlines() if line.startswith("hora: ")]
    waiting = re.compile(
        r"hora: np=2 needs 2 Spark task slots at once; the cluster can run [01] now \([01] "
        r"executors registered\): waiting up to start_timeout=600 s for more executors to register"
    )  # (the first worker's executor may still be registering too)
    assert any(waiting.fullmatch(line) for line in lines), lines
    assert lines[-1] == "hora: the cluster can run 2 tasks at once now; np=2 starts", lines
