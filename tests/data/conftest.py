"""One local[2] Spark for the data door's modules that need one (from_spark, Petastorm's door,
Mosaic's converter): a JVM start costs seconds on 2 cores, so they share one, ended after them.

pyspark keeps one JVM per process, with the environment of its first session: it starts with the
torchvision stand-in first on the path that the JVM, Spark's Python workers and hora's ranks
inherit (Mosaic Streaming imports torchvision; nothing else here imports it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.data import mosaic_stubs


@pytest.fixture(scope="package")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark", reason="pyspark is not installed")
    from tests.spark.conftest import end_spark_jvm, start_spark, stop_spark

    with pytest.MonkeyPatch.context() as patch:
        mosaic_stubs.put_first(patch)
        end_spark_jvm()  # a JVM another package left would lack the stand-in's path
        session = start_spark("local[2]")
        try:
            yield session
        finally:
            stop_spark(session)
            end_spark_jvm()
