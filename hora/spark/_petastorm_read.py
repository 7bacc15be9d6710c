"""What Petastorm's `make_torch_dataloader`/`make_tf_dataset` return, read by hora.data's loader.

Petastorm's reader streams row groups epoch after epoch (`num_epochs=None`: forever) and its
loaders cut that stream into batches of `batch_size`, across the ends of epochs; only the end of
the last epoch gives a shorter batch. The same here, over a `hora.data.Loader` per epoch: this
shard's rows of epoch e, in epoch e's order, then epoch e+1's. A `transform_spec` is the
loader's `transform` (hora/spark/_petastorm_transform.py) and `workers_count` its `num_workers`:
the worker processes that convert the rows and run the transform.
"""

from __future__ import annotations

import itertools
import logging
import re
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hora import environment
from hora.data import Dataset, Loader
from hora.spark._petastorm_transform import SpecTransform, as_transform_spec, plan

logger = logging.getLogger("hora.spark.petastorm")

#: Petastorm's reader arguments that only tune its own thread or process pool: accepted, unused
_POOL_ONLY = frozenset({"results_queue_size", "hdfs_driver", "zmq_copy_buffers", "shard_seed"})
_POOL_TYPES = ("thread", "process", "dummy")
#: arguments of Petastorm's reader with no counterpart here, and what to do instead
_REFUSED = {
    "predicate": "filter the DataFrame before make_spark_converter",
    "rowgroup_selector": "filter the DataFrame before make_spark_converter",
    "filters": "filter the DataFrame before make_spark_converter",
    "storage_options": "give the cache directory as a URI pyarrow opens",
    "filesystem": "give the cache directory as a URI pyarrow opens",
    "cache_location": "hora reads the cache directory directly (no local-disk cache)",
    "cache_size_limit": "hora reads the cache directory directly (no local-disk cache)",
    "cache_row_size_estimate": "hora reads the cache directory directly (no local-disk cache)",
    "cache_extra_settings": "hora reads the cache directory directly (no local-disk cache)",
    "data_loader_fn": "Petastorm's DataLoader classes need Petastorm's reader; iterate the "
    "loader this door gives",
}


@dataclass(frozen=True)
class ReadSpec:
    """Petastorm's reader arguments as a hora loader's: one value, checked before any read."""

    batch_size: int
    num_epochs: int | None
    rank: int
    size: int
    shuffle: bool
    seed: int
    columns: tuple[str, ...] | None
    #: the transform_spec as the loader's transform (None: the columns as they are)
    transform: SpecTransform | None = None
    #: the loader's num_workers (None: its default)
    workers: int | None = None


def read_spec(
    dataset: Dataset,
    batch_size: int | None,
    num_epochs: int | None,
    workers_count: int | None,
    shuffling_queue_capacity: int | None,
    kwargs: Mapping[str, Any],
) -> ReadSpec:
    """The loader's settings for Petastorm's arguments, or an error naming the one to change."""
    kwargs = dict(kwargs)
    for name, why in _REFUSED.items():
        if kwargs.pop(name, None) is not None:
            raise ValueError(f"{name} is Petastorm's and hora has no counterpart: {why}")
    cache_type = kwargs.pop("cache_type", "null")
    if cache_type not in (None, "null"):
        raise ValueError(f"cache_type={cache_type!r}: {_REFUSED['cache_location']}")
    if kwargs.pop("shuffle_row_drop_partitions", 1) != 1:
        raise ValueError(
            "shuffle_row_drop_partitions is not supported: hora shuffles rows within windows of "
            "row groups already (leave it at 1)"
        )
    kwargs.pop("convert_early_to_numpy", None)
    workers = _workers(workers_count, kwargs.pop("reader_pool_type", None))
    transform_spec = kwargs.pop("transform_spec", None)
    for name in _POOL_ONLY:
        kwargs.pop(name, None)
    cur_shard, shard_count = kwargs.pop("cur_shard", None), kwargs.pop("shard_count", None)
    seed = kwargs.pop("seed", None)
    # hora shuffles row groups and rows within windows of them: any of Petastorm's three asks
    shuffles = [kwargs.pop("shuffle_row_groups", True), kwargs.pop("shuffle_rows", False)]
    shuffle = any(shuffles) or bool(shuffling_queue_capacity)
    columns = _columns(dataset, kwargs.pop("schema_fields", None))
    if kwargs:
        raise TypeError(f"unexpected arguments for Petastorm's reader: {sorted(kwargs)}")
    rank, size = _shard(cur_shard, shard_count)
    transform = None
    if transform_spec is not None:
        read = columns if columns is not None else [c.name for c in dataset.columns]
        transform = plan(as_transform_spec(transform_spec), dataset, read)
    return ReadSpec(
        batch_size=_positive("batch_size", 32 if batch_size is None else batch_size),
        num_epochs=None if num_epochs is None else _positive("num_epochs", num_epochs),
        rank=rank,
        size=size,
        shuffle=shuffle,
        seed=0 if seed is None else int(seed),
        columns=columns,
        transform=transform,
        workers=workers,
    )


def _workers(workers_count: Any, pool_type: Any) -> int | None:
    """Petastorm's `workers_count` as the loader's `num_workers` (None: the loader's default);
    its `reader_pool_type="dummy"` (no pool) is 0: the batches are made in the training thread."""
    if pool_type is not None and pool_type not in _POOL_TYPES:
        raise ValueError(f"reader_pool_type must be one of {_POOL_TYPES}, got {pool_type!r}")
    if workers_count is None:
        return 0 if pool_type == "dummy" else None
    if isinstance(workers_count, bool) or not isinstance(workers_count, int) or workers_count < 0:
        raise ValueError(
            f"workers_count must be an int >= 0 (0: in the training thread) or None (a number "
            f"from the host's cores), got {workers_count!r}"
        )
    return workers_count


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _shard(cur_shard: int | None, shard_count: int | None) -> tuple[int, int]:
    """Petastorm's shard arguments: both or neither; neither reads the whole dataset."""
    if (cur_shard is None) != (shard_count is None):
        raise ValueError(
            f"cur_shard={cur_shard!r} and shard_count={shard_count!r}: give both (as "
            "cur_shard=hvd.rank(), shard_count=hvd.size()) or neither (every process reads all)"
        )
    if cur_shard is None or shard_count is None:
        return 0, 1
    size = _positive("shard_count", shard_count)
    if isinstance(cur_shard, bool) or not isinstance(cur_shard, int) or not 0 <= cur_shard < size:
        raise ValueError(f"cur_shard must be an int in [0, {size}), got {cur_shard!r}")
    here = environment.current()
    if here.size is not None and (cur_shard, size) != (here.rank, here.size):
        logger.warning(
            "cur_shard=%d and shard_count=%d differ from this rank (%s of %s): give "
            "cur_shard=hvd.rank(), shard_count=hvd.size() for each rank to train on its own shard",
            cur_shard,
            size,
            here.rank,
            here.size,
        )
    return cur_shard, size


def _columns(dataset: Dataset, schema_fields: Sequence[str] | None) -> tuple[str, ...] | None:
    """Petastorm's `schema_fields`: names or regular expressions a column's whole name matches."""
    if schema_fields is None:
        return None
    if isinstance(schema_fields, str):
        schema_fields = [schema_fields]
    names = [c.name for c in dataset.columns]
    chosen = [n for n in names if any(re.fullmatch(str(p), n) for p in schema_fields)]
    if not chosen:
        raise ValueError(f"schema_fields={list(schema_fields)!r} match none of the columns {names}")
    return tuple(chosen)


def make_loader(dataset: Dataset, spec: ReadSpec) -> Loader:
    """The hora.data loader that reads `spec`'s shard (one epoch per iteration)."""
    return Loader(
        dataset,
        spec.batch_size,
        shuffle=spec.shuffle,
        seed=spec.seed,
        columns=spec.columns,
        transform=spec.transform,
        rank=spec.rank,
        size=spec.size,
        num_workers=spec.workers,
    )


def numpy_stream(loader: Loader, spec: ReadSpec) -> Iterator[dict[str, Any]]:
    """Batches of `spec.batch_size` rows (numpy arrays; bytes and text as lists), epoch after
    epoch, cut across the ends of epochs; the last epoch's end (never, with num_epochs=None) may
    be shorter. The loader's workers end with the stream."""
    held: list[dict[str, Any]] = []
    rows = 0
    epochs = itertools.count() if spec.num_epochs is None else range(spec.num_epochs)
    try:
        for epoch in epochs:
            loader.set_epoch(epoch)
            for batch in loader.numpy_batches():
                held.append(batch)
                rows += _rows(batch)
                while rows >= spec.batch_size:
                    out, held, rows = _take(held, spec.batch_size, rows)
                    yield out
        if rows:
            yield _take(held, rows, rows)[0]
    finally:
        loader.close()


def _rows(batch: Mapping[str, Any]) -> int:
    return len(next(iter(batch.values())))


def _take(
    held: list[dict[str, Any]], size: int, rows: int
) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    """The first `size` held rows as one batch, and what is left."""
    if len(held) == 1 and rows == size:
        return held[0], [], 0
    whole = {k: _joined([b[k] for b in held]) for k in held[0]}
    rest = {k: v[size:] for k, v in whole.items()}
    return {k: v[:size] for k, v in whole.items()}, ([rest] if rows > size else []), rows - size


def _joined(parts: list[Any]) -> Any:
    """Batches' values of one column end to end (lists of bytes or text stay lists)."""
    if isinstance(parts[0], list):
        return [v for part in parts for v in part]
    return np.concatenate(parts)


class _Streams:
    """The loaders a context's iterations opened, to end their workers when it exits (as
    Petastorm's context stops its reader's pool)."""

    def __init__(self, dataset: Dataset, spec: ReadSpec) -> None:
        self.dataset, self.spec = dataset, spec
        self._loaders: weakref.WeakSet[Loader] = weakref.WeakSet()

    def open(self) -> Iterator[dict[str, Any]]:
        loader = make_loader(self.dataset, self.spec)
        self._loaders.add(loader)
        return numpy_stream(loader, self.spec)

    def close(self) -> None:
        for loader in list(self._loaders):
            loader.close()


class TorchLoader:
    """What `make_torch_dataloader` yields: iterate it for dicts of torch tensors by column
    (each `iter()` starts again from the first epoch)."""

    def __init__(self, dataset: Dataset, spec: ReadSpec) -> None:
        self.dataset, self.spec = dataset, spec
        self.batch_size = spec.batch_size
        self._streams = _Streams(dataset, spec)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self._streams.open():
            yield {k: _tensor(v) for k, v in batch.items()}

    def close(self) -> None:
        """End the workers of every iteration (the context's exit does)."""
        self._streams.close()


def _tensor(value: Any) -> Any:
    """A numpy array as a tensor (copied only when read-only, as Arrow's buffers are); text
    and bytes stay lists, as Petastorm's collate leaves them."""
    if isinstance(value, np.ndarray) and value.dtype != object:
        return torch.from_numpy(value if value.flags.writeable else value.copy())
    return list(value)


class TorchLoaderContext:
    """`with converter.make_torch_dataloader(...) as loader:` (Petastorm's context manager)."""

    def __init__(self, dataset: Dataset, spec: ReadSpec) -> None:
        self.loader = TorchLoader(dataset, spec)

    def __enter__(self) -> TorchLoader:
        return self.loader

    def __exit__(self, *exc: object) -> None:
        self.loader.close()


class TFDatasetContext:
    """`with converter.make_tf_dataset(...) as dataset:`: a `tf.data.Dataset` of named tuples
    of batched tensors (`x.features`, as Petastorm's), prefetched (AUTOTUNE unless given).

    The fields and their order are the dataset's columns, or with a transform_spec Petastorm's
    (selected_fields' order when given); the signature is read off the first batch, and with a
    transform_spec checked against its edit fields."""

    def __init__(self, dataset: Dataset, spec: ReadSpec, prefetch: int | None) -> None:
        self.dataset, self.spec, self.prefetch = dataset, spec, prefetch
        self._streams = _Streams(dataset, spec)

    def __enter__(self) -> Any:
        import collections

        import tensorflow as tf

        stream = self._streams.open()
        first = next(stream, None)
        if first is None:
            raise ValueError("this shard has no rows: use fewer shards")
        started: list[Iterator[dict[str, Any]]] = [itertools.chain([first], stream)]
        names = list(first)
        tuple_name = "inferred_schema_view"
        if self.spec.transform is not None:
            tuple_name = "inferred_schema_transformed_view"  # Petastorm's, for a transformed one
        row = collections.namedtuple(tuple_name, names)  # type: ignore[misc]
        signature = row(*[_tensor_spec(tf, n, first[n], self.spec.transform) for n in names])

        def batches() -> Iterator[Any]:
            # the first iteration goes on from the batch read for the signature; others restart
            for batch in started.pop() if started else self._streams.open():
                yield row(*[_tf_value(batch[n]) for n in names])

        found = tf.data.Dataset.from_generator(batches, output_signature=signature)
        return found.prefetch(tf.data.AUTOTUNE if self.prefetch is None else self.prefetch)

    def __exit__(self, *exc: object) -> None:
        self._streams.close()


def _tf_value(value: Any) -> Any:
    """Lists of bytes or text as tf.string's numpy form."""
    return np.array(value, dtype=object) if isinstance(value, list) else value


def _tensor_spec(tf: Any, name: str, value: Any, transform: SpecTransform | None) -> Any:
    """A field's TensorSpec from the first batch, checked against its edit field if it has one."""
    if isinstance(value, list):
        return tf.TensorSpec((None,), tf.string)
    shape, dtype = (None, *value.shape[1:]), value.dtype
    field = next((f for f in transform.fields if f.name == name), None) if transform else None
    if field is not None and field.edited and field.dtype is not None:
        if (value.shape[1:], value.dtype) != (field.shape, field.dtype):
            raise ValueError(
                f"field {name!r}: the first batch holds {value.dtype} rows of shape "
                f"{value.shape[1:]}, its edit field says {field.dtype} {field.shape}"
            )
        shape, dtype = (None, *field.shape), field.dtype
    return tf.TensorSpec(shape, tf.as_dtype(dtype))
