"""Mosaic Streaming runs unchanged inside hora's ranks (issue 30 item 6).

Databricks' current recommendation: `dataframe_to_mds` writes the DataFrame as MDS shards on the
driver, and each rank reads its part with `StreamingDataset` and `StreamingDataLoader`, which take
their rank and world from torchrun's variables (hora's ranks have them). Run through `Runner`
on this machine and `HorovodRunner` as a Spark barrier stage on `local[2]`, every row reaches
exactly one rank once (counted by an id column). `streaming` imports torchvision, whose PyPI
wheels do not load against the CPU torch: a stand-in (tests/data/_stubs) goes first on the path of
this process, of Spark's Python workers and of the ranks.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import hora
from tests.data import mosaic_stubs

pytestmark = pytest.mark.spark

ROWS = 600  # a multiple of the 2 ranks: Mosaic pads a rank's share by repeating samples otherwise
BATCH = 16
COLUMNS = {"id": "int64", "x": "ndarray:float32", "y": "int32"}


@pytest.fixture(scope="module")
def streaming_path(spark) -> None:
    """The package's Spark put the stand-in first on this process's path and in the environment
    the JVM, Spark's Python workers and hora's ranks inherit; `streaming` importable, or skip."""
    pytest.importorskip("streaming", reason="mosaicml-streaming is not installed")


@pytest.fixture(scope="module")
def mds(spark, streaming_path, tmp_path_factory):
    """ROWS rows (an id, 8 float features, a label) written by `dataframe_to_mds`, unchanged."""
    from streaming.base.converters import dataframe_to_mds

    out = tmp_path_factory.mktemp("mds") / "train"
    df = spark.range(ROWS).selectExpr(
        "id",
        # nullable elements: Mosaic maps only ArrayType(FloatType(), containsNull=True)
        "cast(transform(sequence(1, 8), i -> id * i) as array<float>) as x",
        "cast(id % 3 as int) as y",
    )
    dataframe_to_mds(
        df.repartition(3),
        merge_index=True,
        mds_kwargs={"out": str(out), "columns": COLUMNS},
    )
    return str(out)


def read_every_row(path: str, cache: str) -> list[int]:
    """The user's training function: Mosaic's own reader, its shares from torchrun's variables;
    every rank's ids gathered with hvd, so rank 0's value tells who read what."""
    from streaming import StreamingDataLoader, StreamingDataset

    import hora.torch as hvd

    hvd.init()
    # One local cache per host, as Mosaic wants: its local rank 0 fills it for the others.
    dataset = StreamingDataset(remote=path, local=cache, shuffle=True, batch_size=BATCH)
    ids: list[int] = []
    for batch in StreamingDataLoader(dataset, batch_size=BATCH, num_workers=0):
        assert batch["x"].shape[1:] == (8,)
        assert (batch["x"][:, 0] == batch["id"].float()).all()
        ids.extend(int(i) for i in batch["id"])
    return [i for rank in hvd.allgather_object(ids) for i in rank]


def assert_every_row_once(ids: list[int]) -> None:
    assert len(ids) == ROWS, f"{len(ids)} rows read, {ROWS} written"
    assert sorted(ids) == list(range(ROWS))


def test_runner_on_this_machine(mds, tmp_path):
    assert_every_row_once(hora.Runner(np=-2).run(read_every_row, path=mds, cache=str(tmp_path)))


def test_horovod_runner_on_spark(mds, tmp_path):
    from hora import HorovodRunner

    ids = HorovodRunner(np=2).run(read_every_row, path=mds, cache=str(tmp_path))
    assert_every_row_once(ids)


def test_the_stand_in_reaches_the_ranks(streaming_path):
    """The ranks import streaming through the stand-in, not a torchvision of their own."""

    def where() -> str:
        import torchvision

        return torchvision.__file__

    found = hora.Runner(np=-1).run(where)
    assert Path(found).is_relative_to(mosaic_stubs.STUBS), found
    assert sys.modules["torchvision"].__file__ == found
