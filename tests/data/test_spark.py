"""from_spark on a real local[2] Spark: the checks before any rank starts, the cache by content,
and every row reaching exactly one rank once per epoch through hora.run and HorovodRunner."""

from __future__ import annotations

import itertools

import pytest

import hora
import hora.data
from tests.data import _jobs

pytest.importorskip("pyspark", reason="pyspark is not installed")

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]
ROWS = 500


@pytest.fixture(scope="module")
def frame(spark):
    from pyspark.sql import functions as F

    return (
        spark.range(ROWS)
        .select(
            F.col("id"), F.array(F.col("id").cast("float"), F.lit(1.0).cast("float")).alias("x")
        )
        .repartition(3)
    )


def test_bad_input_is_refused_on_the_driver(spark, tmp_path):
    from pyspark.ml.linalg import Vectors
    from pyspark.sql import functions as F

    store = str(tmp_path / "store")
    base = spark.range(4)
    cases = [
        (base.select(F.create_map(F.lit("a"), "id").alias("m")), "column 'm' is a map"),
        (
            spark.createDataFrame([(Vectors.dense([1.0]),)], ["v"]),
            "column 'v' is a struct.*vector_to_array",
        ),
        (
            base.select(F.when(F.col("id") > 0, F.col("id")).alias("n")),
            "column 'n' has 1 null rows",
        ),
        (base.select(F.array_repeat(F.lit(1.0), F.col("id").cast("int")).alias("a")), r"pad="),
        (base.filter("id < 0"), "the DataFrame is empty"),
    ]
    for df, message in cases:
        with pytest.raises(ValueError, match=message):
            hora.data.from_spark(df, store=store)
    assert not list((tmp_path / "store" / "data").iterdir())  # what was written is removed
    padded = hora.data.from_spark(
        base.select("id", F.array_repeat(F.lit(1.0), F.col("id").cast("int")).alias("a")),
        store=store,
        pad={"a": 3},
    )
    batch = next(iter(padded.loader(4, shuffle=False, rank=0, size=1)))
    assert sorted(batch["a"].sum(dim=1).tolist()) == [0.0, 1.0, 2.0, 3.0]


def test_written_once_and_found_again_by_content(frame, tmp_path):
    store = str(tmp_path / "store")
    first = hora.data.from_spark(frame, store=store)
    again = hora.data.from_spark(frame.select("*"), store=store)
    assert first == again and first.fingerprint and len(first) == ROWS
    kept = sorted(p.name for p in (tmp_path / "store" / "data").iterdir())
    assert kept == sorted([first.uri.rsplit("/", 1)[-1], f"{first.fingerprint}.json"]), kept
    first.delete()  # its marker is left: the next call writes the content again
    rewritten = hora.data.from_spark(frame, store=store)
    assert rewritten.fingerprint == first.fingerprint and rewritten.uri != first.uri
    assert len(rewritten) == ROWS
    fresh = hora.data.from_spark(frame, store=store, cache=False)
    assert fresh.uri != first.uri and len(fresh) == ROWS
    exact = hora.data.from_spark(frame, path=str(tmp_path / "here"))
    assert exact.uri == str(tmp_path / "here") and len(exact) == ROWS


def test_every_row_reaches_one_rank_once_per_epoch(frame, tmp_path):
    """hora.run on the local engine (shuffled, 2 epochs) and HorovodRunner(np=2) as Spark
    tasks (unshuffled): the same dataset, captured by the training function."""
    dataset = hora.data.from_spark(frame, store=str(tmp_path / "store"))
    results = hora.run(_jobs.ids_per_epoch, (dataset, 16, True, 2), np=2)
    assert [r["size"] for r in results] == [2, 2]
    for epoch in range(2):
        ids = list(itertools.chain(*(r["ids"][epoch] for r in results)))
        assert sorted(ids) == list(range(ROWS)), epoch
    assert results[0]["ids"][0] != results[0]["ids"][1]  # a new order each epoch
    gathered = hora.HorovodRunner(np=2).run(
        _jobs.ids_by_horovod_runner, dataset=dataset, batch_size=16, shuffle=False
    )
    assert sorted(gathered) == list(range(ROWS))
