"""Which SparkSession hora runs on, found without importing pyspark when the program has not."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any


def active_spark_context() -> Any:
    """The active SparkContext, or None; never imports pyspark if the program has not.

    The SparkContext, not SparkSession.getActiveSession(): that one is per thread, and a session
    created on the notebook's main thread is not "active" in a worker thread.
    """
    if "pyspark" not in sys.modules:
        return None
    from pyspark import SparkContext

    return SparkContext._active_spark_context


@contextlib.contextmanager
def cli_session() -> Iterator[None]:
    """A SparkSession for `hora run --backend spark`, stopped at the end; the cluster comes from
    Spark's own configuration (spark-defaults.conf, PYSPARK_SUBMIT_ARGS), as for `pyspark`."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise ValueError("--backend spark needs pyspark: pip install 'hora[spark]'") from None
    try:
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
