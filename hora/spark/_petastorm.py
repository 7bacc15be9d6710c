"""Petastorm's Spark converter on hora.data: change the import, keep the rest.

`from hora.spark import SparkDatasetConverter, make_spark_converter, TransformSpec` replaces
`from petastorm.spark import ...` and `from petastorm import TransformSpec` (Petastorm 0.13.1
no longer imports against pyarrow >= 15 and needs a classic SparkContext).
`make_spark_converter(df)` writes the DataFrame once as Parquet under the Spark conf
`petastorm.spark.converter.parentCacheDirUrl`, through `hora.data.from_spark` (a classic or
Connect session), and returns a picklable converter to capture in the training function; its
`make_torch_dataloader(...)` and `make_tf_dataset(...)` take Petastorm's arguments
(`transform_spec` runs in the loader's workers, `workers_count` of them). docs/petastorm.md
lists what differs.
"""

from __future__ import annotations

import atexit
import logging
import os
import warnings
from typing import Any

from hora.data import Dataset, from_parquet, from_spark
from hora.spark._petastorm_read import TFDatasetContext, TorchLoaderContext, read_spec
from hora.spark._petastorm_transform import TransformSpec as TransformSpec

logger = logging.getLogger("hora.spark.petastorm")

DEFAULT_ROW_GROUP_SIZE_BYTES = 32 * 1024 * 1024  # Petastorm's
#: Petastorm's codec names; Spark's Parquet writer has no bzip2 or deflate (Petastorm fails too)
_CODECS = {"uncompressed": "uncompressed", "gzip": "gzip", "lz4": "lz4", "snappy": "snappy"}
_NOT_PARQUET = ("bzip2", "deflate")
_SPARK_CODEC_CONF = "spark.sql.parquet.compression.codec"


class SparkDatasetConverter:
    """One DataFrame written as Parquet, to read in the ranks (Petastorm's class of that name).

    Picklable: capture it in the training function. `len(converter)` is the number of rows;
    `make_torch_dataloader` and `make_tf_dataset` read this process's shard; `delete()` removes
    the files.
    """

    PARENT_CACHE_DIR_URL_CONF = "petastorm.spark.converter.parentCacheDirUrl"

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self.cache_dir_url = dataset.uri
        self.file_urls = [dataset.location.location(f) if f else dataset.uri for f in dataset.files]
        self.dataset_size = dataset.rows

    def __len__(self) -> int:
        return self.dataset_size

    def make_torch_dataloader(
        self,
        batch_size: int = 32,
        num_epochs: int | None = None,
        workers_count: int | None = None,
        shuffling_queue_capacity: int = 0,
        data_loader_fn: Any = None,
        **petastorm_reader_kwargs: Any,
    ) -> TorchLoaderContext:
        """A context manager giving an iterable of batches (dicts of torch tensors by column).

        `num_epochs=None` repeats forever; batches run across the ends of epochs. Shard with
        `cur_shard=hvd.rank(), shard_count=hvd.size()` (without them every process reads all
        rows). Rows are shuffled unless `shuffle_row_groups=False` (see docs/data.md).
        `transform_spec=TransformSpec(func, edit_fields, ...)` maps each batch as a pandas
        DataFrame in `workers_count` worker processes (None: a number from the host's cores).
        """
        spec = read_spec(
            self.dataset,
            batch_size,
            num_epochs,
            workers_count,
            shuffling_queue_capacity,
            {**petastorm_reader_kwargs, "data_loader_fn": data_loader_fn},
        )
        return TorchLoaderContext(self.dataset, spec)

    def make_tf_dataset(
        self,
        batch_size: int | None = None,
        prefetch: int | None = None,
        num_epochs: int | None = None,
        workers_count: int | None = None,
        shuffling_queue_capacity: int | None = None,
        **petastorm_reader_kwargs: Any,
    ) -> TFDatasetContext:
        """A context manager giving a `tf.data.Dataset` of named tuples of batched tensors
        (`batch_size` None means 32, `prefetch` None means AUTOTUNE; the rest as for torch)."""
        spec = read_spec(
            self.dataset,
            batch_size,
            num_epochs,
            workers_count,
            shuffling_queue_capacity,
            petastorm_reader_kwargs,
        )
        return TFDatasetContext(self.dataset, spec, prefetch)

    def delete(self) -> None:
        """Remove the Parquet files this converter reads (other converters of the same
        DataFrame read the same files: they cannot be read after this)."""
        _forget(self.cache_dir_url)
        self.dataset.delete()


_written: set[str] = set()


def _forget(url: str) -> None:
    _written.discard(url)


def _delete_at_exit(dataset: Dataset) -> None:
    """Petastorm removes what its converters wrote when the driver exits; so does this door."""
    if dataset.uri not in _written:
        return
    try:
        dataset.delete()
    except Exception as e:  # best effort, as Petastorm's
        warnings.warn(f"could not delete the converter's cache {dataset.uri}: {e}", stacklevel=1)


def make_spark_converter(
    df: Any,
    parquet_row_group_size_bytes: int = DEFAULT_ROW_GROUP_SIZE_BYTES,
    compression_codec: str | None = None,
    dtype: str | None = "float32",
) -> SparkDatasetConverter:
    """Write `df` once as Parquet (reused for the same content) and return a converter.

    `df` may also be the path or URI of Parquet already written. The files go under the Spark
    conf `petastorm.spark.converter.parentCacheDirUrl` (a path, `file:///...` or a URI pyarrow
    opens, which the driver, the executors and every rank reach); without it, where
    `hora.data.from_spark` writes by default. `dtype` "float32" (Petastorm's default) or
    "float64" casts floating columns and arrays (Spark ML vectors become arrays); None keeps them.
    """
    if isinstance(df, str | os.PathLike):
        return SparkDatasetConverter(from_parquet(df))
    codec = _codec(compression_codec)
    _check_row_group_size(parquet_row_group_size_bytes)
    df = _with_dtype(df, dtype)
    spark = df.sparkSession
    store = _conf(spark, SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF)
    before = _conf(spark, _SPARK_CODEC_CONF)
    spark.conf.set(_SPARK_CODEC_CONF, codec)
    try:
        dataset = from_spark(df, store=store, row_group_bytes=parquet_row_group_size_bytes)
    finally:
        if before is None:
            spark.conf.unset(_SPARK_CODEC_CONF)
        else:
            spark.conf.set(_SPARK_CODEC_CONF, before)
    if dataset.uri not in _written:
        _written.add(dataset.uri)
        atexit.register(_delete_at_exit, dataset)
    return SparkDatasetConverter(dataset)


def _codec(name: str | None) -> str:
    """Petastorm's default is uncompressed Parquet; its other names as Spark calls them."""
    name = (name or "uncompressed").lower()
    if name in _NOT_PARQUET:
        raise ValueError(
            f"compression_codec={name!r}: Spark's Parquet writer has no {name} codec; use one "
            f"of {sorted(_CODECS)} or None (uncompressed)"
        )
    if name not in _CODECS:
        raise ValueError(
            f"compression_codec must be None or one of {sorted(_CODECS)}, got {name!r}"
        )
    return _CODECS[name]


def _check_row_group_size(size: Any) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"parquet_row_group_size_bytes must be a positive int, got {size!r}")


def _conf(spark: Any, key: str) -> str | None:
    try:
        value = spark.conf.get(key, None)
    except Exception:  # a Connect server that does not tell
        return None
    return str(value) if value else None


def _with_dtype(df: Any, dtype: str | None) -> Any:
    """Petastorm's `dtype`: Spark ML vectors to arrays, and floating values (alone or in
    arrays) to float32 or float64; integers unchanged."""
    if dtype is None:
        return df
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32', 'float64' or None, got {dtype!r}")
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    source, target = (
        (T.DoubleType, T.FloatType()) if dtype == "float32" else (T.FloatType, T.DoubleType())
    )
    columns = []
    for field in df.schema.fields:
        column = F.col(f"`{field.name}`")
        kind = field.dataType
        if isinstance(kind, T.UserDefinedType) and kind.simpleString() == "vector":
            columns.append(_vector_to_array(column, dtype).alias(field.name))
        elif isinstance(kind, source):
            columns.append(column.cast(target).alias(field.name))
        elif isinstance(kind, T.ArrayType) and isinstance(kind.elementType, source):
            columns.append(column.cast(T.ArrayType(target)).alias(field.name))
        else:
            columns.append(column)
    return df.select(*columns)


def _vector_to_array(column: Any, dtype: str) -> Any:
    """Spark ML's `vector_to_array` (imports pyspark.ml: only for a DataFrame with vectors)."""
    from pyspark.ml.functions import vector_to_array

    return vector_to_array(column, dtype)
