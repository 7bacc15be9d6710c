"""Real local Spark for the engine's tests: one SparkSession per test module, loopback only.

Skipped cleanly when pyspark or Java is missing. Every test checks that no hora worker process
(the training processes the Spark tasks start) survives it.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import stat
import sys
import time

import pytest

from tests.conftest import tagged_processes, worker_processes

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed")
if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
    pytest.skip("Java is not installed: Spark cannot start", allow_module_level=True)

os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
# For Spark's own jobs in these tests (a slot blocker, a raw barrier stage): hora's ranks need
# none of it on a local master; test_executor_python.py checks that with a user's environment.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def start_spark(master: str, **conf: str):
    """A SparkSession bound to 127.0.0.1 with the UI off; the caller stops it."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._gateway is not None:  # a JVM an earlier module left: alive, or forgotten
        try:
            SparkContext._gateway.jvm.java.lang.System.currentTimeMillis()
        except Exception:
            forget_spark()

    # A fresh Builder: `SparkSession.builder` is shared and keeps the last module's options.
    builder = (
        SparkSession.Builder()
        .master(master)
        .appName("hora-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", "ERROR")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def fake_gpus(folder: pathlib.Path, *claims: list[str]) -> str:
    """A Spark GPU discovery script, as pyspark's own tests fake GPUs: each run hands out the
    next unclaimed address list of `claims` (one per worker of a local-cluster, or the
    driver's), as {"name": "gpu", "addresses": [...]}; no CUDA needed."""
    script = folder / "discover.sh"
    lines = ["#!/bin/sh"]
    for i, addresses in enumerate(claims):
        found = json.dumps({"name": "gpu", "addresses": addresses})
        lines.append(f"mkdir '{folder}/claimed-{i}' 2>/dev/null && echo '{found}' && exit 0")
    script.write_text("\n".join([*lines, "exit 1", ""]))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def stop_spark(session) -> None:
    """Stop `session` and forget its settings: Spark leaves them in the JVM's system properties,
    where the next module's session would inherit them (GPU resources on a local master).

    A JVM that died, or a gateway left mid-call (a test stopped by its timeout inside a py4j
    call answers every later call with garbage), is ended and forgotten instead: one test's
    broken JVM must not fail every later module that starts Spark."""
    try:
        system = session.sparkContext._jvm.System
        session.stop()
        for key in list(system.getProperties().stringPropertyNames()):
            if str(key).startswith("spark."):
                system.clearProperty(key)
    except Exception:
        forget_spark()
        raise


def forget_spark() -> None:
    """End this process's JVM, whatever its state, and pyspark's memory of its session."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    with contextlib.suppress(Exception):
        end_spark_jvm()
    SparkContext._gateway = SparkContext._jvm = None
    SparkContext._active_spark_context = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None


@pytest.fixture(scope="package", autouse=True)
def spark_jvm_ends_with_these_tests():
    yield
    end_spark_jvm()


def end_spark_jvm() -> None:
    """pyspark keeps its JVM (and Python daemons) for the life of the process; end them, so
    the other tests' check that no process survives sees none of Spark's."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    with contextlib.suppress(Exception):  # a gateway whose connection broke mid-call
        gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc is not None:
        proc.stdin.close()  # the JVM exits when its stdin closes; make sure of it
        proc.terminate()
        proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while tagged_processes() and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.fixture(autouse=True)
def no_worker_survives_spark():
    yield
    deadline = time.monotonic() + 10
    while (left := worker_processes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"hora worker processes left running after the test: {left}"
