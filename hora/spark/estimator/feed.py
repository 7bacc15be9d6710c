"""The data feed without Petastorm: the DataFrame goes to Parquet once, each rank reads its own
shard with pyarrow, and batches come from a background thread, the same number on every rank.

Driver side (`prepare`): one Spark job fingerprints the rows' content (count and an
order-independent sum of row hashes) and checks that array columns have one length; the same
content with the same settings is found again under `<store>/data/<fingerprint>/` and not
written twice. The validation split follows from each row's hash and the seed, so it is the
same on every fit of the same data.

Rank side (`read_shard`, `Batches`): rank r of n holds rows [r*N/n, (r+1)*N/n) of the written
files (shards differ by at most one row). Every epoch each rank shuffles its shard (seeded by
seed, epoch and rank) and trains on the first N//n rows of that order, so all ranks run the same
number of steps, ceil((N//n) / batch_size), the last one possibly smaller: a rank never waits
alone in a collective. The at most n-1 rows left over in an epoch differ from epoch to epoch.
"""

from __future__ import annotations

import hashlib
import json
import math
import queue
import threading
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hora.spark.estimator.columns import ColumnSpec, numeric_column, to_numpy
from hora.spark.estimator.store import Store

_FORMAT = 1  # bump when what is written under data/ changes
_DONE = "_HORA_DONE.json"
_SPLIT_BUCKETS = 1_000_000


@dataclass(frozen=True)
class PreparedData:
    """Where a fit's rows are, how many, and the shapes found in them."""

    key: str
    train_path: str
    validation_path: str | None
    train_rows: int
    validation_rows: int
    features: tuple[ColumnSpec, ...]
    labels: tuple[ColumnSpec, ...]
    reused: bool


def sample(
    df: Any,
    features: list[ColumnSpec],
    labels: list[ColumnSpec],
    input_shapes: Sequence[Sequence[int]] | None,
    rows: int = 2,
) -> tuple[list[ColumnSpec], list[np.ndarray]]:
    """The first `rows` rows as arrays, and the columns' shapes found in them (or given by
    `input_shapes`): what the driver tries the model on before anything else runs."""
    import pyarrow as pa

    specs = [*features, *labels]
    names = [f"c{i}" for i in range(len(specs))]
    columns = [numeric_column(s, n) for s, n in zip(specs, names, strict=True)]
    head = df.select(*columns).limit(rows).toPandas()
    head.attrs = {}  # a Connect client's toPandas puts its plan metrics here; pyarrow warns on them
    if not len(head):
        raise ValueError("the DataFrame is empty: there is nothing to train on")
    table = pa.Table.from_pandas(head, preserve_index=False)
    shaped = _shapes(specs, table, len(features), input_shapes)
    arrays = [to_numpy(table.column(n), s) for n, s in zip(names, shaped, strict=True)]
    return shaped, arrays


def prepare(
    df: Any,
    store: Store,
    specs: list[ColumnSpec],
    n_features: int,
    validation: float | str | None,
    seed: int,
) -> PreparedData:
    """Write the DataFrame's feature and label columns to the store (unless already there).

    `specs` come from `sample`; every row is checked to hold as many values as they say.
    """
    from pyspark.sql import functions as F

    names = [f"c{i}" for i in range(len(specs))]
    columns = [numeric_column(s, n) for s, n in zip(specs, names, strict=True)]
    if isinstance(validation, str):
        columns.append(F.col(validation).cast("boolean").alias("is_validation"))
    data = df.select(*columns)
    facts = _checked_facts(data, specs, names)
    key = _fingerprint(facts, specs, validation, seed)
    done = store.data(key, _DONE)
    if store.exists(done):
        info = json.loads(store.read_bytes(done))
        return _prepared(store, key, info, specs, n_features, reused=True)

    if isinstance(validation, float):
        bucket = F.pmod(F.xxhash64(*[F.col(c) for c in names], F.lit(seed)), F.lit(_SPLIT_BUCKETS))
        data = data.withColumn("is_validation", bucket < int(validation * _SPLIT_BUCKETS))
    store.delete_dir(store.data(key, "train"))
    store.delete_dir(store.data(key, "validation"))
    if validation is None:
        data.write.mode("overwrite").parquet(store.spark_location("data", key, "train"))
    else:
        flagged = F.coalesce(F.col("is_validation"), F.lit(False))
        data.filter(~flagged).drop("is_validation").write.mode("overwrite").parquet(
            store.spark_location("data", key, "train")
        )
        data.filter(flagged).drop("is_validation").write.mode("overwrite").parquet(
            store.spark_location("data", key, "validation")
        )
    info = {
        "format": _FORMAT,
        "train_rows": count_rows(store, store.data(key, "train")),
        "validation_rows": (
            0 if validation is None else count_rows(store, store.data(key, "validation"))
        ),
    }
    store.write_bytes(done, json.dumps(info).encode())
    return _prepared(store, key, info, specs, n_features, reused=False)


def _checked_facts(data: Any, specs: list[ColumnSpec], names: list[str]) -> dict[str, Any]:
    """One pass over the selected columns: the row count, a content hash, and every array
    column's shortest and longest row, which must both be the length its spec says."""
    from pyspark.sql import functions as F

    row_hash = F.xxhash64(*[F.col(c) for c in data.columns])
    stats = [
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.shiftright(row_hash, 32)).alias("high"),
        F.sum(row_hash.bitwiseAND(0xFFFFFFFF)).alias("low"),
    ]
    arrays = [
        (spec, name) for spec, name in zip(specs, names, strict=True) if spec.kind != "scalar"
    ]
    for _, name in arrays:
        sizes = F.coalesce(F.size(name), F.lit(-1))
        stats += [F.min(sizes).alias(f"{name}_min"), F.max(sizes).alias(f"{name}_max")]
    facts: dict[str, Any] = data.agg(*stats).collect()[0].asDict()
    if not facts["rows"]:
        raise ValueError("the DataFrame is empty: there is nothing to train on")
    for spec, name in arrays:
        low, high, wanted = facts[f"{name}_min"], facts[f"{name}_max"], math.prod(spec.shape)
        if not low == high == wanted:
            raise ValueError(
                f"column {spec.name!r} holds arrays of {low} to {high} values (or nulls, "
                f"counted as -1), not {wanted} in every row; a batch needs one length: pad, "
                "truncate or filter them"
            )
    return facts


def _shapes(
    specs: list[ColumnSpec],
    table: Any,
    n_features: int,
    input_shapes: Sequence[Sequence[int]] | None,
) -> list[ColumnSpec]:
    if input_shapes is not None and len(input_shapes) != n_features:
        raise ValueError(
            f"input_shapes has {len(input_shapes)} shapes for {n_features} feature columns; "
            "give one shape per feature column"
        )
    shaped = []
    for i, spec in enumerate(specs):
        if spec.kind == "scalar":
            found: tuple[int, ...] = (1,) if i < n_features else ()
        else:
            first = table.column(f"c{i}")[0]
            if not first.is_valid:
                raise ValueError(f"column {spec.name!r} has null rows; drop or fill them first")
            found = (len(first),)
        if i < n_features and input_shapes is not None:
            wanted = tuple(int(d) for d in input_shapes[i])
            if math.prod(wanted) != math.prod(found):
                raise ValueError(
                    f"input_shapes[{i}]={list(wanted)} holds {math.prod(wanted)} values but "
                    f"column {spec.name!r} has {math.prod(found)} per row"
                )
            found = wanted
        shaped.append(spec.with_shape(found))
    return shaped


def _fingerprint(facts: dict[str, Any], specs: list[ColumnSpec], validation: Any, seed: int) -> str:
    described = {
        "format": _FORMAT,
        "rows": facts["rows"],
        "hash": [facts["high"], facts["low"]],
        "columns": [[s.kind, s.integral, list(s.shape)] for s in specs],
        "validation": validation,
        "seed": seed if isinstance(validation, float) else None,
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:20]


def _prepared(
    store: Store, key: str, info: dict[str, Any], specs: list[ColumnSpec], n: int, reused: bool
) -> PreparedData:
    validation_rows = int(info["validation_rows"])
    return PreparedData(
        key=key,
        train_path=store.data(key, "train"),
        validation_path=store.data(key, "validation") if validation_rows else None,
        train_rows=int(info["train_rows"]),
        validation_rows=validation_rows,
        features=tuple(specs[:n]),
        labels=tuple(specs[n:]),
        reused=reused,
    )


def _parquet_files(filesystem: Any, path: str) -> list[str]:
    from pyarrow import fs

    infos = filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True))
    names = [i.path for i in infos if i.type == fs.FileType.File and i.path.endswith(".parquet")]
    return sorted(names)


def count_rows(store: Store, path: str) -> int:
    import pyarrow.parquet as pq

    filesystem = store.filesystem()
    total = 0
    for name in _parquet_files(filesystem, path):
        with filesystem.open_input_file(name) as f:
            total += pq.ParquetFile(f).metadata.num_rows
    return total


def read_shard(
    store: Store, path: str, specs: Sequence[ColumnSpec], rank: int, size: int
) -> list[np.ndarray]:
    """Rank `rank`'s contiguous slice of the Parquet rows under `path`, one array per column.

    Only the files (and row groups) that overlap the slice are read.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    filesystem = store.filesystem()
    files = []
    for name in _parquet_files(filesystem, path):
        f = filesystem.open_input_file(name)
        files.append(pq.ParquetFile(f))
    total = sum(p.metadata.num_rows for p in files)
    start, stop = rank * total // size, (rank + 1) * total // size
    pieces, offset = [], 0
    for parquet in files:
        meta = parquet.metadata
        for group in range(meta.num_row_groups):
            rows = meta.row_group(group).num_rows
            lo, hi = max(start, offset), min(stop, offset + rows)
            if lo < hi:
                table = parquet.read_row_group(group)
                pieces.append(table.slice(lo - offset, hi - lo))
            offset += rows
    names = [f"c{i}" for i in range(len(specs))]
    if not pieces:
        return [np.zeros((0, *s.shape), np.int64 if s.integral else np.float32) for s in specs]
    table = pa.concat_tables(pieces)
    return [to_numpy(table.column(n), s) for n, s in zip(names, specs, strict=True)]


def steps_per_epoch(total_rows: int, size: int, batch_size: int) -> int:
    """The same on every rank: the smallest shard's rows, in batches, the last one partial."""
    return math.ceil((total_rows // size) / batch_size)


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    return (
        int.from_bytes(hashlib.sha256(f"{seed}/{epoch}/{rank}".encode()).digest()[:8], "little")
        >> 1
    )


class Batches:
    """A rank's shard as tensors, cut into the epoch's batches by a background thread.

    The thread gathers the next batches (and moves them to the device) while the training loop
    computes; `prefetch` batches wait at most. An error in the thread is raised in the loop.
    """

    def __init__(
        self,
        arrays: Sequence[np.ndarray],
        rows_per_epoch: int,
        batch_size: int,
        device: Any,
        prefetch: int = 4,
    ) -> None:

        self._tensors = [_as_tensor(a) for a in arrays]
        self._held = len(arrays[0]) if arrays else 0
        self.rows_per_epoch = min(rows_per_epoch, self._held)
        self._batch_size = batch_size
        self._device = device
        self._prefetch = prefetch

    def __len__(self) -> int:
        return math.ceil(self.rows_per_epoch / self._batch_size)

    def epoch(self, shuffle_seed: int | None) -> Iterator[list[Any]]:
        """The batches of one epoch: a seeded permutation of the shard, or its order (None)."""
        import torch

        if shuffle_seed is None:
            order = torch.arange(self._held)
        else:
            generator = torch.Generator().manual_seed(shuffle_seed)
            order = torch.randperm(self._held, generator=generator)
        order = order[: self.rows_per_epoch]
        return self._in_background(order)

    def all(self) -> Iterator[list[Any]]:
        """Every row held, in order (for validation), in batches."""
        import torch

        return self._in_background(torch.arange(self._held))

    def _in_background(self, order: Any) -> Iterator[list[Any]]:
        """The batches of `order`, gathered (and moved to the device) by a thread that keeps
        `prefetch` of them ready while the loop trains on the last."""
        out: queue.Queue[Any] = queue.Queue(maxsize=self._prefetch)
        stop = threading.Event()
        thread = threading.Thread(
            target=self._produce, args=(order, out, stop), name="hora-feed", daemon=True
        )
        thread.start()
        try:
            while True:
                item = out.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            thread.join()

    def _produce(self, order: Any, out: queue.Queue[Any], stop: threading.Event) -> None:
        try:
            for begin in range(0, len(order), self._batch_size):
                index = order[begin : begin + self._batch_size]
                batch = [t.index_select(0, index) for t in self._tensors]
                if self._device.type != "cpu":
                    batch = [t.pin_memory().to(self._device, non_blocking=True) for t in batch]
                if not _put(out, stop, batch):
                    return
            _put(out, stop, _END)
        except BaseException as e:  # handed to the loop, raised there
            _put(out, stop, e)


_END = object()  # the producer's last word


def _put(out: queue.Queue[Any], stop: threading.Event, item: Any) -> bool:
    """Hand `item` to the loop; False once the loop has stopped listening."""
    while not stop.is_set():
        try:
            out.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _as_tensor(array: np.ndarray) -> Any:
    """The shard as a tensor over Arrow's own (read-only) buffer, without a copy: batches are
    gathered out of it with index_select, so nothing ever writes to it."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's note on read-only arrays
        return torch.from_numpy(np.ascontiguousarray(array))
