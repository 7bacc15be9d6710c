"""One local[2] Spark for the data door's modules that need one (from_spark, Petastorm's door,
Mosaic's converter): a JVM start costs seconds on 2 cores, so they share one, ended after them.

pyspark keeps one JVM per process, with the environment of its first session: it starts with the
torchvision stand-in first on the path that the JVM, Spark's Python workers and hora's ranks
inherit (Mosaic Streaming imports torchvision; nothing else here imports it). The JVM lives
until the package's end, and tests that use no Spark check that no process of theirs is left
(tests/conftest.py): they run first.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.data import mosaic_stubs

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """This package's tests without the spark mark before those with it, each kept in order
    (the hook sees every test of the session: the others keep their places)."""
    slots = [i for i, item in enumerate(items) if item.path.resolve().parent == HERE]
    ordered = sorted(
        (items[i] for i in slots), key=lambda item: item.get_closest_marker("spark") is not None
    )
    for slot, item in zip(slots, ordered, strict=True):
        items[slot] = item


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
    mosaic_stubs.forget()
