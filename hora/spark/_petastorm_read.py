"""What Petastorm's `make_torch_dataloader`/`make_tf_dataset` return, read by hora.data's loader.

Petastorm's reader streams row groups epoch after epoch (`num_epochs=None`: forever) and its
loaders cut that stream into batches of `batch_size`, across the ends of epochs; only the end of
the last epoch gives a shorter batch. The same here, over a `hora.data.Loader` per epoch: this
shard's rows of epoch e, in epoch e's order, then epoch e+1's.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import count
from typing import Any

import numpy as np
import torch

from hora import environment
from hora.data import Dataset, Loader

logger = logging.getLogger("hora.spark.petastorm")

#: Petastorm's reader arguments that only tune its own thread or process pool: accepted, unused
_POOL_ONLY = frozenset(
    {"reader_pool_type", "results_queue_size", "hdfs_driver", "zmq_copy_buffers", "shard_seed"}
)
#: arguments of Petastorm's reader with no counterpart here, and what to do instead
_REFUSED = {
    "transform_spec": "pass the rows through your own code after the loader (or use "
    "hora.data's loader(transform=...))",
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


def read_spec(
    dataset: Dataset,
    batch_size: int | None,
    num_epochs: int | None,
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
    kwargs.pop("workers_count", None)
    kwargs.pop("convert_early_to_numpy", None)
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
    return ReadSpec(
        batch_size=_positive("batch_size", 32 if batch_size is None else batch_size),
        num_epochs=None if num_epochs is None else _positive("num_epochs", num_epochs),
        rank=rank,
        size=size,
        shuffle=shuffle,
        seed=0 if seed is None else int(seed),
        columns=columns,
    )


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


def numpy_stream(dataset: Dataset, spec: ReadSpec) -> Iterator[dict[str, np.ndarray]]:
    """Batches of `spec.batch_size` rows as numpy arrays, epoch after epoch, cut across the
    ends of epochs; the last epoch's end (never, with num_epochs=None) may be shorter."""
    loader = Loader(
        dataset,
        spec.batch_size,
        shuffle=spec.shuffle,
        seed=spec.seed,
        columns=spec.columns,
        rank=spec.rank,
        size=spec.size,
    )
    held: list[dict[str, np.ndarray]] = []
    rows = 0
    epochs = count() if spec.num_epochs is None else range(spec.num_epochs)
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


def _rows(batch: Mapping[str, np.ndarray]) -> int:
    return len(next(iter(batch.values())))


def _take(
    held: list[dict[str, np.ndarray]], size: int, rows: int
) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]], int]:
    """The first `size` held rows as one batch, and what is left."""
    if len(held) == 1 and rows == size:
        return held[0], [], 0
    whole = {k: np.concatenate([b[k] for b in held]) for k in held[0]}
    rest = {k: v[size:] for k, v in whole.items()}
    return {k: v[:size] for k, v in whole.items()}, ([rest] if rows > size else []), rows - size


class TorchLoader:
    """What `make_torch_dataloader` yields: iterate it for dicts of torch tensors by column
    (each `iter()` starts again from the first epoch)."""

    def __init__(self, dataset: Dataset, spec: ReadSpec) -> None:
        self.dataset, self.spec = dataset, spec
        self.batch_size = spec.batch_size

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in numpy_stream(self.dataset, self.spec):
            yield {k: _tensor(v) for k, v in batch.items()}


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
        return None


class TFDatasetContext:
    """`with converter.make_tf_dataset(...) as dataset:`: a `tf.data.Dataset` of named tuples
    of batched tensors (`x.features`, as Petastorm's), prefetched (AUTOTUNE unless given)."""

    def __init__(self, dataset: Dataset, spec: ReadSpec, prefetch: int | None) -> None:
        self.dataset, self.spec, self.prefetch = dataset, spec, prefetch

    def __enter__(self) -> Any:
        import collections

        import tensorflow as tf

        first = next(numpy_stream(self.dataset, self.spec), None)
        if first is None:
            raise ValueError("this shard has no rows: use fewer shards")
        names = list(first)
        row = collections.namedtuple("inferred_schema_view", names)  # type: ignore[misc]
        signature = row(
            *[
                tf.TensorSpec((None, *first[n].shape[1:]), tf.as_dtype(first[n].dtype))
                for n in names
            ]
        )

        def batches() -> Iterator[Any]:
            for batch in numpy_stream(self.dataset, self.spec):
                yield row(*[batch[n] for n in names])

        found = tf.data.Dataset.from_generator(batches, output_signature=signature)
        return found.prefetch(tf.data.AUTOTUNE if self.prefetch is None else self.prefetch)

    def __exit__(self, *exc: object) -> None:
        return None
