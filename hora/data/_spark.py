"""`from_spark`: a DataFrame written once as Parquet through Spark's own writer, on the driver of
a classic or Connect session, checked before any rank starts, and found again by its content;
or, when the DataFrame is a plain scan of Parquet files, those files read in place (`_in_place`).

One Spark job writes the DataFrame and, in the same pass (`DataFrame.observe`), counts its facts:
rows, a content hash (when caching), non-null values per column, the shortest and longest array
per array column. What cannot become a tensor is refused then, and what was written removed: a
second job that only read the facts cost a third to half of the conversion. The footers of what
was written are read on the driver: fewer rows there than Spark counted means the store is not
one place for the driver and the executors. A cached write is kept under a fresh name and found
again through a marker named by its fingerprint (the fingerprint is known only once written).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pyarrow as pa

from hora.data._columns import ARRAY, BYTES, Column, describe
from hora.data._dataset import Dataset, EmptyDataError, parquet_files, read_footers
from hora.data._files import WRITTEN
from hora.data._in_place import read_in_place
from hora.data._scan import plain_scan
from hora.storage import Location

_FORMAT = 2  # bump when what is written changes (2: written once, found by a marker)
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


def _write(
    df: Any, columns: list[Column], target: Location, fingerprint: bool, row_group_bytes: int
) -> dict[str, Any]:
    """One job: the DataFrame written to `target`, and its facts counted on the way (rows, a
    content hash when caching, non-null counts, array lengths)."""
    from pyspark.sql import Observation
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
    facts = Observation("hora.data")
    try:
        writer = df.observe(facts, *stats).write.mode("overwrite")
        writer = writer.option("parquet.block.size", str(row_group_bytes))
        for key in _no_dictionary(columns):
            writer = writer.option(key, "false")
        writer.parquet(target.spark_location())
    except Exception as e:
        raise ValueError(
            f"Spark could not write the DataFrame to {target.uri!r} ({str(e).splitlines()[0]}); "
            "give a store= (or path=) that the driver and every executor can write"
        ) from e
    return dict(facts.get)


def _no_dictionary(columns: list[Column]) -> list[str]:
    """Parquet-mr's options that skip dictionary encoding for floating-point columns: their
    values are rarely repeated, and trying a dictionary first made the write slower."""
    floating = [c for c in columns if c.kind != BYTES and c.dtype.startswith("float")]
    return [
        f"parquet.enable.dictionary#{c.name}" + (".list.element" if c.kind == ARRAY else "")
        for c in floating
    ]


def _checked(facts: dict[str, Any], columns: list[Column], pad: Mapping[str, int]) -> list[Column]:
    if not facts["rows"]:
        raise EmptyDataError("the DataFrame is empty: there is nothing to train on")
    out = []
    for i, c in enumerate(columns):
        if c.kind != BYTES and facts[f"n{i}"] != facts["rows"]:
            raise ValueError(
                f"column {c.name!r} has {facts['rows'] - facts[f'n{i}']} null rows, which cannot "
                f"become a tensor: fill them (df.fillna) or drop them (df.dropna(subset="
                f"[{c.name!r}])) first"
            )
        if c.kind == ARRAY:
            lo, hi = int(facts[f"lo{i}"]), int(facts[f"hi{i}"])
            if lo != hi and c.name not in pad:
                raise ValueError(
                    f"column {c.name!r} holds arrays of {lo} to {hi} values; a tensor needs one "
                    f"length: make them one length first, or pass from_spark pad={{{c.name!r}: "
                    f"{hi}}} to pad them with zeros"
                )
            if c.name in pad and hi > pad[c.name]:
                raise ValueError(
                    f"column {c.name!r} holds arrays of up to {hi} values, more than "
                    f"pad={pad[c.name]}: raise it to at least {hi}"
                )
            c = replace(c, lengths=(lo, hi))
        out.append(c)
    return out


# Spark's own master URLs of one machine (local, local[N], local-cluster[...]), where the
# driver's temporary directory is also the executors'.
_SPARK_LOCAL_MASTER = re.compile(r"local(\[|-cluster\[|$)")


def _store(spark: Any, store: str | os.PathLike[str] | None) -> Location:
    if store is None:
        store = _conf(spark, STORE_CONF)
    if store is None:
        master = _conf(spark, "spark.master") or ""
        if not _SPARK_LOCAL_MASTER.match(master):
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
    copy: bool | None = None,
) -> Dataset:
    """Write `df` once as Parquet and return a small picklable `hora.data.Dataset` to capture in
    the training function (call its `loader()` in each rank); or, when `df` is a plain scan of
    Parquet files, read those files in place.

    `copy`: None (the default) reads a plain scan in place, no Spark job and nothing written
    (`spark.read.parquet(...)` or `spark.table(...)` of Parquet, columns selected or renamed),
    and writes anything else; True always writes; False never writes (refused when `df` is not
    a plain scan). `dataset.origin` says which ("in place" or "written"), and the logger
    `hora.data` says why at INFO. `path=` asks for a copy there.

    Where a copy goes: `path` exactly (written again each call), else under `store` (or the
    Spark conf `hora.data.store`; a temp directory on a local master) at `data/<fresh name>/`;
    with `cache` the same content written before with the same settings is found again by its
    fingerprint and this write is dropped (`cache=False`: no fingerprint, a fresh directory
    kept). Columns must be numbers, arrays of numbers of one length (or `pad`ded: column ->
    length, zeros after), or text/bytes for a loader's `transform`; no nulls outside text. On a
    refusal what was written is removed.
    """
    pad = dict(pad or {})
    columns = check_schema(df.schema)
    found = _in_place(df, columns, pad, path, copy)
    if found is not None:
        return found
    use_cache = cache and path is None
    if path is not None:
        target, data = Location.parse(path, "path"), None
    else:
        data = _store(df.sparkSession, store).child("data")
        target = data.child(uuid.uuid4().hex)  # the fingerprint is known only once written
    target.check_writable()
    facts = _write(df, columns, target, use_cache, row_group_bytes)
    try:
        columns = _checked(facts, columns, pad)
        key = _fingerprint(facts, columns, pad, row_group_bytes) if use_cache else ""
        dataset = _described(target, key, columns, pad, facts["rows"])
    except ValueError:
        _remove(target)
        raise
    if data is None or not key:
        return dataset
    marker = f"{key}.json"
    cached = _cached(data, marker, key, columns, pad, facts["rows"])
    if cached is not None:
        _remove(target)
        return cached
    name = target.root.rstrip("/").rsplit("/", 1)[-1]
    data.write_bytes(marker, json.dumps({"rows": dataset.rows, "dir": name}).encode())
    return dataset


def _cached(
    data: Location, marker: str, key: str, columns: list[Column], pad: dict[str, int], rows: int
) -> Dataset | None:
    """The dataset an earlier call wrote with this fingerprint, if its files are still there."""
    if not data.exists(marker):
        return None
    try:
        return _described(
            data.child(json.loads(data.read_bytes(marker))["dir"]), key, columns, pad, rows
        )
    except (ValueError, KeyError, OSError):  # deleted, or half there: written again
        return None


def _remove(target: Location) -> None:
    with contextlib.suppress(OSError):  # best effort: the refusal says what matters
        target.remove_tree()


def _described(
    target: Location, key: str, columns: list[Column], pad: dict[str, int], rows: int
) -> Dataset:
    found = read_footers(target, key, pad) if parquet_files(target) else None
    if found is None or found.rows != rows:
        raise ValueError(
            f"Spark wrote {rows} rows to {target.uri!r} but the driver finds "
            f"{found.rows if found else 0} there: the executors wrote to disks the driver does "
            "not see; give a store= (or path=) that is one place for the driver, every executor "
            "and every rank (a shared mount, or a URI such as hdfs:// or s3://)"
        )
    return replace(found, columns=tuple(columns), origin=WRITTEN)


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


def _in_place(
    df: Any, columns: list[Column], pad: dict[str, int], path: Any, copy: bool | None
) -> Dataset | None:
    """The Dataset over the DataFrame's own Parquet files when it is a plain scan; None when it
    is to be written (logged with the reason); a ValueError where `copy=False` cannot be kept."""
    if copy is True:
        reason = "copy=True asks for one"
    elif path is not None:
        if copy is False:
            raise ValueError(f"path={str(path)!r} asks for a copy there, and copy=False for none")
        reason = "path= asks for a copy there"
    else:
        scan = plain_scan(df)
        found = scan if isinstance(scan, str) else read_in_place(scan, columns, pad)
        if isinstance(found, Dataset):
            _say(
                f"hora: from_spark reads the DataFrame's {len(found.files)} Parquet files under "
                f"{found.uri} in place (a plain scan: no Spark job, nothing written)"
            )
            return found
        reason = found
    if copy is False:
        raise ValueError(
            f"from_spark(copy=False): the DataFrame cannot be read in place: {reason}. Read only "
            "Parquet files, selecting or renaming columns (no filters, joins, casts or UDFs), "
            "or let from_spark write it (copy=None or True)"
        )
    _say(f"hora: from_spark writes the DataFrame as Parquet: {reason}")
    return None


def _say(text: str) -> None:
    """What the driver tells its user, on stderr as hora's driver says everything."""
    print(text, file=sys.stderr, flush=True)
