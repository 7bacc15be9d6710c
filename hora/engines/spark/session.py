"""Which Spark session hora runs on, found without importing pyspark when the program has not.

Two kinds: a classic session (a SparkContext in this process) and a Spark Connect session (a
client of a Spark Connect server: Databricks Connect, shared and serverless clusters,
`SparkSession.builder.remote(...)`), which has no SparkContext. `active_session()` returns the
one the program made as a `Session`: what the engine, the checks and the doors need from it,
implemented by `classic.ClassicSession` and `connect.ConnectSession`.

A Connect session is looked for first: `remote("local[N]")` hosts its Connect server in this
very process, so a classic SparkContext is alive next to it, and it is the server's, not the
program's.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

#: Where the tasks dial hora's driver, when Spark's own idea of it is not reachable from them.
DRIVER_HOST_ENV = "HORA_DRIVER_HOST"
DRIVER_HOST_KEY = "spark.hora.driverHost"


class Session(ABC):
    """The active Spark session as hora uses it: read its configuration, count its slots, run
    one barrier stage of hora's tasks, cancel it."""

    kind: Literal["classic", "connect"]

    @property
    @abstractmethod
    def master(self) -> str:
        """The cluster's master URL (`local[2]`, `local-cluster[2,1,1024]`, `yarn`, ...)."""

    @abstractmethod
    def conf(self, key: str, default: str = "") -> str:
        """A Spark setting as the cluster has it, or `default` when it is not set."""

    @abstractmethod
    def check(self) -> None:
        """Raise if this session cannot run hora's stage at all, saying what to change."""

    @abstractmethod
    def driver_gpus(self, resource: str = "gpu") -> list[str] | None:
        """The addresses of the Spark driver's GPU resources, or None when it has none."""

    @abstractmethod
    def slots(self) -> int | None:
        """How many tasks can run at once now (cores only), or None when it cannot be known."""

    @abstractmethod
    def executors(self) -> int | None:
        """How many executors are registered, or None when it cannot be known."""

    @abstractmethod
    def default_channel_host(self) -> str:
        """The address of this machine that the executors reach, as far as Spark says."""

    @abstractmethod
    def thread(self, target: Callable[[], None], name: str) -> threading.Thread:
        """A (not started) thread that carries the caller's Spark job group, pool and tags."""

    @abstractmethod
    def run_barrier(
        self, np: int, driver: dict[str, str], spec: Mapping[str, Any], tag: str
    ) -> Any:
        """Run `np` tasks of `entry` in one barrier stage tagged `tag`; blocks until it ends and
        returns its rows, one (task, outcome) per task."""

    @abstractmethod
    def cancel(self, tag: str) -> None:
        """Cancel the stage tagged `tag` (and only it); callable from any thread."""

    def channel_host(self) -> str:
        """Where the tasks dial hora's driver: HORA_DRIVER_HOST (or spark.hora.driverHost),
        else what this kind of session knows."""
        override = os.environ.get(DRIVER_HOST_ENV) or self.conf(DRIVER_HOST_KEY)
        return override.strip() if override.strip() else self.default_channel_host()


def active_connect_session() -> Any:
    """The Spark Connect SparkSession this program made (from any thread), or None.

    Only a Connect session imports `pyspark.sql.connect.session`; `active()` falls back from the
    thread's session to the process's default one, so a notebook's helper thread finds it too.
    """
    module = sys.modules.get("pyspark.sql.connect.session")
    if module is None:
        return None
    try:
        return module.SparkSession.active()
    except Exception:  # pyspark's NO_ACTIVE_OR_DEFAULT_SESSION
        return None


def active_spark_context() -> Any:
    """The program's active SparkContext, or None; never imports pyspark if the program has not.

    None in a Spark Connect client, which has none (the SparkContext that `remote("local[N]")`
    starts in this process is its server's). The SparkContext, not
    SparkSession.getActiveSession(): that one is per thread, and a session created on the
    notebook's main thread is not "active" in a worker thread.
    """
    if "pyspark" not in sys.modules or active_connect_session() is not None:
        return None
    from pyspark import SparkContext

    return SparkContext._active_spark_context


def active_session() -> Session | None:
    """The program's Spark session (Connect first), or None; imports pyspark only if it is."""
    spark = active_connect_session()
    if spark is not None:
        from hora.engines.spark.connect import ConnectSession

        return ConnectSession(spark)
    sc = active_spark_context()
    if sc is not None:
        from hora.engines.spark.classic import ClassicSession

        return ClassicSession(sc)
    return None


@contextlib.contextmanager
def cli_session(remote: str | None = None) -> Iterator[None]:
    """A SparkSession for `hora run --backend spark`, stopped at the end: a Spark Connect
    session to `remote` (or to SPARK_REMOTE, as pyspark does), else a classic one whose cluster
    comes from Spark's own configuration (spark-defaults.conf, PYSPARK_SUBMIT_ARGS)."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        extra = "connect" if remote else "spark"
        raise ValueError(f"--backend spark needs pyspark: pip install 'hora[{extra}]'") from None
    try:
        if remote:
            session = SparkSession.builder.remote(remote).getOrCreate()
        elif os.environ.get("SPARK_REMOTE"):  # the builder makes a Connect session by itself
            session = SparkSession.builder.getOrCreate()
        else:
            builder = SparkSession.builder.appName("hora run")
            # Spark's progress bar would cut through the ranks' log lines on the same terminal.
            builder = builder.config("spark.ui.showConsoleProgress", "false")
            session = builder.getOrCreate()
    except Exception as exc:
        raise ValueError(f"--backend spark could not start a SparkSession: {exc}") from exc
    try:
        yield
    finally:
        session.stop()
