"""from_spark without a copy, on a real local[2] Spark: a plain scan of Parquet files is read in
place (no job, nothing under the store), with the rows the written path gives; columns selected
and renamed map to the files' own; anything else is written, and says why; files the driver
cannot find are refused. (A Connect session's plain scan: tests/spark/connect/test_data.py.)"""

from __future__ import annotations

import itertools
import shutil
import urllib.parse
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import hora.data
from tests.data._parquet import step_world, write_ids

pytest.importorskip("pyspark", reason="pyspark is not installed")

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]
ROWS = 600  # write_ids: 3 files of 200 rows, row groups of 32


def ids_of(dataset, size, shuffle):
    """One epoch's ids over a world of `size` ranks, rank after rank."""
    loaders = [
        dataset.loader(16, shuffle=shuffle, rank=r, size=size, columns=["id"], seed=2)
        for r in range(size)
    ]
    return list(itertools.chain(*step_world(loaders)))


def test_a_plain_scan_is_read_in_place(spark, tmp_path, capsys):
    write_ids(tmp_path / "files")
    store = tmp_path / "store"
    df = spark.read.parquet(str(tmp_path / "files"))
    dataset = hora.data.from_spark(df, store=str(store))
    assert not store.exists()  # nothing written, not even the store's directory
    assert dataset.origin == "in place" and dataset.uri == str(tmp_path / "files")
    assert "hora: from_spark reads the DataFrame's 3 Parquet files" in capsys.readouterr().err
    assert len(dataset) == ROWS and len(dataset.pieces) == 3 * 7 and dataset.fingerprint
    for size, shuffle in ((1, False), (2, True), (3, True)):
        assert sorted(ids_of(dataset, size, shuffle)) == list(range(ROWS)), (size, shuffle)
    assert ids_of(dataset, 1, False) == list(range(ROWS))  # the files' order
    written = hora.data.from_spark(df, store=str(store), copy=True)
    assert written.origin == "written" and written.uri.startswith(str(store))
    assert sorted(ids_of(written, 2, True)) == list(range(ROWS))
    assert [(c.name, c.kind, c.dtype) for c in written.columns] == [
        (c.name, c.kind, c.dtype) for c in dataset.columns
    ]
    again = hora.data.from_spark(spark.read.parquet(str(tmp_path / "files")), store=str(store))
    assert again == dataset
    # a file rewritten in place (new content, same name) is other data: a new fingerprint
    part = tmp_path / "files" / "part-1.parquet"
    pq.write_table(pq.read_table(part).slice(0, 100), part, row_group_size=32)
    changed = hora.data.from_spark(spark.read.parquet(str(tmp_path / "files")), store=str(store))
    assert changed.fingerprint != dataset.fingerprint and len(changed) == ROWS - 100


def test_selected_and_renamed_columns_read_the_files_columns(spark, tmp_path):
    from pyspark.sql import functions as F

    write_ids(tmp_path / "files")
    store = tmp_path / "store"
    df = spark.read.parquet(str(tmp_path / "files"))
    renamed = df.select(F.col("x").alias("features"), F.col("id").alias("key"))
    dataset = hora.data.from_spark(renamed.withColumnRenamed("key", "label"), store=str(store))
    assert dataset.origin == "in place"
    assert [c.name for c in dataset.columns] == ["features", "label"]
    assert dataset.renamed == {"features": "x", "label": "id"}
    loader = dataset.loader(50, shuffle=True, rank=0, size=1)
    labels = []
    for batch in loader:
        assert set(batch) == {"features", "label"} and batch["features"].shape[1:] == (3,)
        assert (batch["features"][:, 0].long() == batch["label"]).all()
        labels += batch["label"].tolist()
    assert sorted(labels) == list(range(ROWS))
    # a table over the files; Spark's catalog makes its (empty) default warehouse directory
    # under the working directory on first use: removed again if this made it
    warehouse = Path(urllib.parse.urlsplit(spark.conf.get("spark.sql.warehouse.dir")).path)
    made = not warehouse.exists()
    spark.catalog.createTable("hora_scan_ids", path=str(tmp_path / "files"), source="parquet")
    try:
        table = hora.data.from_spark(spark.table("hora_scan_ids").select("id"), store=str(store))
        assert table.origin == "in place" and len(table) == ROWS
    finally:
        spark.sql("DROP TABLE hora_scan_ids")  # an external table: its files stay
        if made and warehouse.is_dir() and not any(warehouse.iterdir()):
            warehouse.rmdir()
    assert not store.exists()


def test_anything_else_is_written_and_says_why(spark, tmp_path, capsys):
    from pyspark.sql import functions as F

    write_ids(tmp_path / "files")
    folder = tmp_path / "parted"  # hive-style directories k=0, k=1
    table = pa.table({"id": list(range(40)), "k": [i % 2 for i in range(40)]})
    pq.write_to_dataset(table, folder, partition_cols=["k"])
    store = str(tmp_path / "store")
    df = spark.read.parquet(str(tmp_path / "files"))
    plus_one = F.udf(lambda i: i + 1, "long")
    cases = [
        (df.filter("id % 2 = 0"), ROWS // 2, "Filter"),
        (df.join(df.select("id"), "id"), ROWS, "Join"),
        (df.select(plus_one("id").alias("id")), ROWS, "EvalPython"),
        (spark.read.parquet(str(folder)), 40, "partition columns ['k']"),
    ]
    for frame, rows, why in cases:
        capsys.readouterr()
        dataset = hora.data.from_spark(frame, store=store, cache=False)
        said = capsys.readouterr().err
        assert dataset.origin == "written" and len(dataset) == rows, why
        assert "hora: from_spark writes the DataFrame as Parquet" in said and why in said, said
    ids_only = hora.data.from_spark(spark.read.parquet(str(folder)).select("id"), store=store)
    assert ids_only.origin == "in place" and sorted(ids_of(ids_only, 1, True)) == list(range(40))
    with pytest.raises(ValueError, match=r"copy=False\).*cannot be read in place.*Filter"):
        hora.data.from_spark(df.filter("id > 3"), store=store, copy=False)
    with pytest.raises(ValueError, match="copy=False for none"):
        hora.data.from_spark(df, path=str(tmp_path / "there"), copy=False)
    exact = hora.data.from_spark(df, path=str(tmp_path / "there"))
    assert exact.origin == "written" and exact.uri == str(tmp_path / "there")


def test_what_cannot_be_read_in_place_is_refused(spark, tmp_path):
    store = tmp_path / "store"
    nulls = tmp_path / "nulls"
    nulls.mkdir()
    pq.write_table(pa.table({"id": [1, 2, 3], "n": [1.0, None, 3.0]}), nulls / "part.parquet")
    with pytest.raises(ValueError, match=r"column 'n' has 1 null rows.*dropna"):
        hora.data.from_spark(spark.read.parquet(str(nulls)), store=str(store))
    text = hora.data.from_spark(spark.read.parquet(str(nulls)).select("id"), store=str(store))
    assert text.origin == "in place" and len(text) == 3
    write_ids(tmp_path / "gone")
    df = spark.read.parquet(str(tmp_path / "gone"))  # Spark lists the files now
    shutil.rmtree(tmp_path / "gone")  # the driver no longer finds them
    with pytest.raises(ValueError, match=r"driver does not find .*copy=True"):
        hora.data.from_spark(df, store=str(store))
    assert not store.exists()
