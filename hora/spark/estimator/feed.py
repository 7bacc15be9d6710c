"""The data feed without Petastorm: the DataFrame goes to Parquet once, each rank reads its own
shard with pyarrow, and batches come from a background thread, the same number on every rank.

Driver side (`prepare`): one Spark job fingerprints the rows' content (count and an
order-independent sum of row hashes) and checks that array columns have one length; the same
content with the same settings is found again under `<store>/data/<fingerprint>/` and not
written twice. The validation split follows from each row's hash and the seed, so it is the
same on every fit of the same data.

Rank side (`Batches`): the written files are read through `hora.data`'s loader: each epoch's
order is seeded by the run's seed and the epoch, every row reaches one rank once per epoch,
every rank runs the same number of steps (a rank never waits alone in a collective), and a
rank's rows are streamed within the loader's prefetch budget instead of held whole.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import hora.data
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


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    return (
        int.from_bytes(hashlib.sha256(f"{seed}/{epoch}/{rank}".encode()).digest()[:8], "little")
        >> 1
    )


class Batches:
    """A rank's share of the Parquet at `location`, streamed by a `hora.data` loader in batches:
    a list of tensors (one per column, shaped as its spec says) on `device`.

    `epoch(e)` is epoch e's order (seeded by the run's seed and e; the file order without
    shuffle): every row once per epoch, the same number of batches on every rank. `all()` is
    the share in file order (validation; rank 0 reads every row when there are fewer rows than
    ranks). The loader's reader thread holds at most its prefetch budget of rows ahead.
    """

    def __init__(
        self,
        location: str,
        specs: Sequence[ColumnSpec],
        batch_size: int,
        device: Any,
        rank: int,
        size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
    ) -> None:
        dataset = hora.data.from_parquet(location)
        self._names = [f"c{i}" for i in range(len(specs))]
        self._shapes = {n: tuple(s.shape) for n, s in zip(self._names, specs, strict=True)}
        self._device = device
        # the transform is a reshape: nothing for worker processes to take off this thread
        options: dict[str, Any] = {
            "columns": self._names,
            "transform": self._shaped,
            "num_workers": 0,
        }
        if dataset.rows >= size:
            self._loader = dataset.loader(
                batch_size, shuffle=shuffle, seed=seed, rank=rank, size=size, **options
            )
            self._ordered = dataset.loader(
                batch_size, shuffle=False, rank=rank, size=size, **options
            )
        else:  # fewer rows than ranks: rank 0 reads them all, the others none
            self._loader = self._ordered = dataset.loader(
                batch_size, shuffle=False, rank=0, size=1, **options
            )
            if rank:
                self._loader = self._ordered = None  # type: ignore[assignment]

    def _shaped(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {n: a.reshape((len(a), *self._shapes[n])) for n, a in batch.items()}

    def __len__(self) -> int:
        return len(self._loader) if self._loader is not None else 0

    def epoch(self, epoch: int) -> Iterator[list[Any]]:
        """The batches of one epoch."""
        if self._loader is None:
            return iter(())
        self._loader.set_epoch(epoch)
        return self._moved(self._loader)

    def all(self) -> Iterator[list[Any]]:
        """Every row of the share, in file order, in batches (for validation)."""
        if self._ordered is None:
            return iter(())
        self._ordered.set_epoch(0)
        return self._moved(self._ordered)

    def _moved(self, loader: Any) -> Iterator[list[Any]]:
        for batch in loader:
            tensors = [batch[n] for n in self._names]
            if self._device.type != "cpu":
                tensors = [t.pin_memory().to(self._device, non_blocking=True) for t in tensors]
            yield tensors
