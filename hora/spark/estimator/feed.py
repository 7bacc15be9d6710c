"""The data feed: the DataFrame's feature and label columns written once by `hora.data.from_spark`
(its writer, its fingerprint, its checks), each rank's share streamed by `hora.data`'s loader.

Driver side (`prepare`): the columns cast as the model reads them (float32, int64 labels,
fixed-length arrays), split into training and validation rows (a fraction by each row's hash
and the seed, so the same on every fit of the same data; or a boolean column), each split handed
to `from_spark`, which refuses empty data, nulls and arrays of several lengths, and finds the
same content written before under `<store>/data/` instead of keeping a second copy.

Rank side (`Batches`): each epoch's order is seeded by the run's seed and the epoch, every row
reaches one rank once per epoch, every rank runs the same number of steps (a rank never waits
alone in a collective), and a rank's rows are streamed within the loader's prefetch budget
instead of held whole.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import hora.data
from hora.spark.estimator.columns import ColumnSpec, numeric_column, to_numpy
from hora.storage import Location

_SPLIT_BUCKETS = 1_000_000
_VALIDATION_FLAG = "__hora_is_validation"  # a column of the selection, never written


@dataclass(frozen=True)
class PreparedData:
    """A fit's rows as `hora.data` Datasets, the columns' names there, and their shapes."""

    train: hora.data.Dataset
    validation: hora.data.Dataset | None
    names: tuple[str, ...]  # the written column of each spec, features then labels
    features: tuple[ColumnSpec, ...]
    labels: tuple[ColumnSpec, ...]

    @property
    def train_rows(self) -> int:
        return self.train.rows

    @property
    def validation_rows(self) -> int:
        return self.validation.rows if self.validation is not None else 0


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


def written_names(specs: Sequence[ColumnSpec]) -> list[str]:
    """The column each spec is written as: its own name (so that `from_spark`'s refusals name
    the user's column), with a suffix where one column is read twice (a feature and a label)."""
    names: list[str] = []
    for i, spec in enumerate(specs):
        taken = spec.name in names or spec.name == _VALIDATION_FLAG
        names.append(f"{spec.name}__{i}" if taken else spec.name)
    return names


def prepare(
    df: Any,
    store: Location,
    specs: list[ColumnSpec],
    n_features: int,
    validation: float | str | None,
    seed: int,
) -> PreparedData:
    """Write the DataFrame's feature and label columns under the store (unless already there).

    `specs` come from `sample`; `from_spark` checks that every row holds as many values as
    they say (arrays of one length, no nulls) and that there are rows to train on.
    """
    from pyspark.sql import functions as F

    names = written_names(specs)
    columns = [numeric_column(s, n) for s, n in zip(specs, names, strict=True)]
    if isinstance(validation, str):
        columns.append(F.col(f"`{validation}`").cast("boolean").alias(_VALIDATION_FLAG))
    data = df.select(*columns)
    held_out = None
    if validation is None:
        train = _written(data, store)
    else:
        if isinstance(validation, float):
            row_hash = F.xxhash64(*[F.col(f"`{n}`") for n in names], F.lit(seed))
            bucket = F.pmod(row_hash, F.lit(_SPLIT_BUCKETS))
            data = data.withColumn(_VALIDATION_FLAG, bucket < int(validation * _SPLIT_BUCKETS))
        flagged = F.coalesce(F.col(_VALIDATION_FLAG), F.lit(False))
        train = _written(data.filter(~flagged).drop(_VALIDATION_FLAG), store)
        try:
            held_out = _written(data.filter(flagged).drop(_VALIDATION_FLAG), store)
        except hora.data.EmptyDataError:
            held_out = None  # no row fell in the validation split: a fit without validation
    return PreparedData(
        train, held_out, tuple(names), tuple(specs[:n_features]), tuple(specs[n_features:])
    )


def _written(frame: Any, store: Location) -> hora.data.Dataset:
    """One split through `from_spark`, under the estimator's store."""
    return hora.data.from_spark(frame, store=store.uri)


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


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    return (
        int.from_bytes(hashlib.sha256(f"{seed}/{epoch}/{rank}".encode()).digest()[:8], "little")
        >> 1
    )


class Batches:
    """A rank's share of a `hora.data` Dataset, streamed by its loader in batches: a list of
    tensors (one per column of `names`, shaped as its spec says) on `device`.

    `epoch(e)` is epoch e's order (seeded by the run's seed and e; the file order without
    shuffle): every row once per epoch, the same number of batches on every rank. `all()` is
    the share in file order (validation; rank 0 reads every row when there are fewer rows than
    ranks). The loader's reader thread holds at most its prefetch budget of rows ahead.
    """

    def __init__(
        self,
        dataset: hora.data.Dataset,
        names: Sequence[str],
        specs: Sequence[ColumnSpec],
        batch_size: int,
        device: Any,
        rank: int,
        size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
    ) -> None:
        self._names = list(names)
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
