"""Which Spark session hora runs on, found without importing pyspark when the program has not.

Two kinds: a classic session (a SparkContext in this process) and a Spark Connect session (a
client of a Spark Connect server: Databricks Connect, shared and serverless clusters,
`SparkSession.builder.remote(...)`), which has no SparkContext. `active_session()` returns the
one the program made as a `base.Session`: what the engine, the checks and the doors need from
it (`classic.ClassicSession`, `connect.ConnectSession`).

A Connect session is looked for first: `remote("local[N]")` hosts its Connect server in this
very process, so a classic SparkContext is alive next to it, and it is the server's, not the
program's.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from hora.engines.spark.base import Session
from hora.engines.spark.classic import ClassicSession
from hora.engines.spark.connect import ConnectSession


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
        return ConnectSession(spark)
    sc = active_spark_context()
    return None if sc is None else ClassicSession(sc)


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
