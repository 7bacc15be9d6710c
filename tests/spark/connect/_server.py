"""A separate Spark Connect server from the pyspark wheel, for tests: start, address, stop.

It runs `bin/spark-submit --class ...SparkConnectServer` (what sbin/start-connect-server.sh runs,
without spark-daemon.sh's pid file in /tmp and log in site-packages) in its own process group,
bound to 127.0.0.1 on a port the server picks itself (port 0) and reports in its log. Its
executors run `python` (PYSPARK_PYTHON in the server's environment: a client cannot choose it).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
_STARTED = re.compile(r"Spark Connect server started at: \S*?:(\d+)")
# local-cluster's workers keep each app's executor folders in $SPARK_HOME/work/<app id>
_APP_ID = re.compile(r"Connected to Spark cluster with app ID (app-[\w-]+)")


@dataclass
class ConnectServer:
    proc: subprocess.Popen
    port: int
    log: Path
    started_s: float

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @classmethod
    def start(
        cls, master: str, python: str, log: Path, env: dict[str, str], timeout: float = 180.0
    ) -> ConnectServer:
        """Start a server over `master` whose tasks run `python`; wait until it listens."""
        env = {
            k: v for k, v in env.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")
        }
        env.update(
            SPARK_HOME=str(SPARK_HOME),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_CONNECT_MODE="0",  # a classic driver, as start-connect-server.sh exports
            PYSPARK_PYTHON=python,
        )
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": "0",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            # The server ends a query's response stream after this long and the client
            # reattaches (default 2 min): short here, so that stages outlive their stream.
            "spark.connect.execute.reattachable.senderMaxStreamDuration": "5s",
        }
        args = [str(SPARK_HOME / "bin" / "spark-submit"), "--class", SERVER_CLASS]
        args += ["--name", "hora tests: Spark Connect server", "--master", master]
        for key, value in conf.items():
            args += ["--conf", f"{key}={value}"]
        args.append("spark-internal")
        started = time.monotonic()
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # one killpg reaches its executors' JVMs too
            )
        server = cls(proc, 0, log, 0.0)
        while time.monotonic() - started < timeout:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"the Connect server exited with {proc.returncode}:\n{server.tail()}"
                )
            found = _STARTED.search(log.read_text(errors="replace"))
            if found:
                server.port, server.started_s = int(found[1]), time.monotonic() - started
                return server
            time.sleep(0.2)
        server.stop()
        raise TimeoutError(f"the Connect server did not start in {timeout} s:\n{server.tail()}")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM (the server's shutdown hook stops its executors), then SIGKILL the group;
        remove the app's folder that local-cluster leaves in $SPARK_HOME/work."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        found = _APP_ID.search(self.log.read_text(errors="replace"))
        if found:
            work = SPARK_HOME / "work"
            shutil.rmtree(work / found[1], ignore_errors=True)
            with contextlib.suppress(OSError):
                work.rmdir()  # only if no other app's folder is left
