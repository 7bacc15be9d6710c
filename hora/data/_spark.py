"""`from_spark`: a DataFrame written once as Parquet through Spark's own writer, on the driver of
a classic or Connect session, checked before any rank starts, and found again by its content.

One Spark job reads the DataFrame for its facts (rows, a content hash, nulls per column, the
shortest and longest array per array column) and refuses what cannot become a tensor; a second
writes it (skipped when the same content was written before with the same settings). The
footers of what was written are then read on the driver: fewer rows there than Spark counted
means the store is not one place for the driver and the executors.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pyarrow as pa

from hora.data._columns import ARRAY, BYTES, Column, describe
from hora.data._dataset import Dataset, read_footers
from hora.storage import Location

_FORMAT = 1  # bump when what is written changes
_DONE = "_HORA_DONE.json"
#: where from_spark writes when no store is given: a Spark conf, else (local masters) a temp dir
STORE_CONF = "hora.data.store"
#: Parquet row groups are the unit of reading and shuffling: small enough to stream
DEFAULT_ROW_GROUP_BYTES = 16 << 20


def arrow_type(spark_type: Any) -> pa.DataType:
    """The Arrow type Spark's Parquet writer gives a Spark type (for the column checks)."""
    from pyspark.sql import types as T

    simple = {
        T.ByteType: pa.int8(),
        T.ShortType: pa.int16(),
        T.IntegerType: pa.int32(),
        T.LongType: pa.int64(),
        T.FloatType: pa.float32(),
        T.DoubleType: pa.float64(),
        T.BooleanType: pa.bool_(),
        T.StringType: pa.string(),
        T.BinaryType: pa.binary(),
        T.DateType: pa.date32(),
        T.TimestampType: pa.timestamp("us"),
    }
    if isinstance(spark_type, T.UserDefinedType):
        return arrow_type(spark_type.sqlType())
    for kind, arrow in simple.items():
        if isinstance(spark_type, kind):
            return arrow
    if isinstance(spark_type, T.DecimalType):
        return pa.decimal128(spark_type.precision, spark_type.scale)
    if isinstance(spark_type, T.ArrayType):
        return pa.list_(arrow_type(spark_type.elementType))
    if isinstance(spark_type, T.MapType):
        return pa.map_(arrow_type(spark_type.keyType), arrow_type(spark_type.valueType))
    if isinstance(spark_type, T.StructType):
        return pa.struct([pa.field(f.name, arrow_type(f.dataType)) for f in spark_type.fields])
    return pa.null()


def check_schema(schema: Any) -> list[Column]:
    """Each column as the loader will see it; a ColumnError for the first that cannot be one."""
    return [describe(pa.field(f.name, arrow_type(f.dataType))) for f in schema.fields]


def _facts(df: Any, columns: list[Column], fingerprint: bool) -> dict[str, Any]:
    """One job: rows, a content hash (when caching), non-null counts, array lengths."""
    from pyspark.sql import functions as F

    stats = [F.count(F.lit(1)).alias("rows")]
    if fingerprint:
        row_hash = F.xxhash64(*[F.col(f"`{c.name}`") for c in columns])
        stats += [
            F.sum(F.shiftright(row_hash, 32)).alias("high"),
            F.sum(row_hash.bitwiseAND(0xFFFFFFFF)).alias("low"),
        ]
    for i, c in enumerate(columns):
        if c.kind != BYTES:
            stats.append(F.count(F.col(f"`{c.name}`")).alias(f"n{i}"))
        if c.kind == ARRAY:
            sizes = F.size(F.col(f"`{c.name}`"))
            stats += [F.min(sizes).alias(f"lo{i}"), F.max(sizes).alias(f"hi{i}")]
    return dict(df.agg(*stats).collect()[0].asDict())


def _checked(facts: dict[str, Any], columns: list[Column], pad: Mapping[str, int]) -> list[Column]:
    if not facts["rows"]:
        raise ValueError("the DataFrame is empty: there is nothing to train on")
    out = []
    for i, c in enumerate(columns):
        if c.kind != BYTES and facts[f"n{i}"] != facts["rows"]:
            raise ValueError(
                f"column {c.name!r} has {facts['rows'] - facts[f'n{i}']} null rows, which cannot "
                f"become a tensor: fill them (df.fillna) or drop them (df.dropna(subset="
                f"[{c.name!r}])) before from_spark"
            )
        if c.kind == ARRAY:
            lo, hi = int(facts[f"lo{i}"]), int(facts[f"hi{i}"])
            if lo != hi and c.name not in pad:
                raise ValueError(
                    f"column {c.name!r} holds arrays of {lo} to {hi} values; a tensor needs one "
                    f"length: pass pad={{{c.name!r}: {hi}}} to pad them with zeros, or make "
                    "them one length before from_spark"
                )
            if c.name in pad and hi > pad[c.name]:
                raise ValueError(
                    f"column {c.name!r} holds arrays of up to {hi} values, more than "
                    f"pad={pad[c.name]}: raise it to at least {hi}"
                )
            c = replace(c, lengths=(lo, hi))
        out.append(c)
    return out


def _store(spark: Any, store: str | os.PathLike[str] | None) -> Location:
    if store is None:
        store = _conf(spark, STORE_CONF)
    if store is None:
        master = _conf(spark, "spark.master") or ""
        if not master.startswith("local"):
            raise ValueError(
                f"from_spark needs a store every executor and rank reach on master {master!r}: "
                f"pass store= (a shared path or a URI pyarrow opens) or set the Spark conf "
                f"{STORE_CONF}"
            )
        store = os.path.join(tempfile.gettempdir(), "hora-data")
    return Location.parse(store, "store")


def _conf(spark: Any, key: str) -> str | None:
    try:
        value = spark.conf.get(key, None)
    except Exception:  # a Connect server that does not tell
        return None
    return str(value) if value else None


def from_spark(
    df: Any,
    *,
    path: str | os.PathLike[str] | None = None,
    cache: bool = True,
    store: str | os.PathLike[str] | None = None,
    pad: Mapping[str, int] | None = None,
    row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
) -> Dataset:
    """Write `df` once as Parquet and return a small picklable `hora.data.Dataset` to capture in
    the training function (call its `loader()` in each rank).

    Where: `path` exactly (written again each call), else under `store` (or the Spark conf
    `hora.data.store`; a temp directory on a local master) at `data/<content fingerprint>/`,
    reused when the same content was written before (`cache=False`: a fresh directory, no
    fingerprint). Columns must be numbers, arrays of numbers of one length (or `pad`ded: column
    -> length, zeros after), or text/bytes for a loader's `transform`; no nulls outside text.
    """
    pad = dict(pad or {})
    columns = check_schema(df.schema)
    use_cache = cache and path is None
    facts = _facts(df, columns, fingerprint=use_cache)
    columns = _checked(facts, columns, pad)
    if path is not None:
        target = Location.parse(path, "path")
        key = ""
    else:
        root = _store(df.sparkSession, store)
        key = _fingerprint(facts, columns, pad, row_group_bytes) if use_cache else uuid.uuid4().hex
        target = root.child("data", key)
        if use_cache and target.exists(target.path(_DONE)):
            return _described(target, key, columns, pad, facts["rows"])
    target.check_writable()
    try:
        writer = df.write.mode("overwrite").option("parquet.block.size", str(row_group_bytes))
        writer.parquet(target.spark_location())
    except Exception as e:
        raise ValueError(
            f"Spark could not write the DataFrame to {target.uri!r} ({str(e).splitlines()[0]}); "
            "give a store= (or path=) that the driver and every executor can write"
        ) from e
    dataset = _described(target, key, columns, pad, facts["rows"])
    if key:
        target.write_bytes(target.path(_DONE), json.dumps({"rows": dataset.rows}).encode())
    return dataset


def _described(
    target: Location, key: str, columns: list[Column], pad: dict[str, int], rows: int
) -> Dataset:
    dataset = read_footers(target, key, pad)
    if dataset.rows != rows:
        raise ValueError(
            f"Spark wrote {rows} rows to {target.uri!r} but the driver finds {dataset.rows} "
            "there: the executors wrote to disks the driver does not see; give a store= (or "
            "path=) that is one place for the driver, every executor and every rank (a shared "
            "mount, or a URI such as hdfs:// or s3://)"
        )
    return replace(dataset, columns=tuple(columns))


def _fingerprint(
    facts: dict[str, Any], columns: list[Column], pad: Mapping[str, int], row_group_bytes: int
) -> str:
    described = {
        "format": _FORMAT,
        "rows": facts["rows"],
        "hash": [facts["high"], facts["low"]],
        "columns": [[c.name, c.kind, c.dtype] for c in columns],
        "pad": dict(pad),
        "row_group_bytes": row_group_bytes,
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:20]
