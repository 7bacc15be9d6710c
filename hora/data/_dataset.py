"""A Dataset: Parquet files somewhere every rank reaches, described by their footers, small and
picklable so that a training function can capture it. `loader()` and `tf_dataset()` read it."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hora.data._columns import describe
from hora.data._files import Files, Piece
from hora.data._footers import Footer
from hora.data._footers import read_footers as footers
from hora.data._loader import DEFAULT_PREFETCH, Loader
from hora.data._tf import tf_dataset
from hora.storage import Location


class EmptyDataError(ValueError):
    """The data has no rows: there is nothing to train on (a door that splits its data, the
    estimator's validation rows, tells an empty part from a wrong one by this class)."""


@dataclass(frozen=True)
class Dataset(Files):
    """Parquet files under `uri` (a path or any URI pyarrow opens), as the loader reads them.

    Build one with `hora.data.from_spark(df)` on the driver, `hora.data.from_parquet(path)` or
    `hora.data.from_delta(table)`; capture it in the training function and call `loader()` in
    each rank.
    """

    def loader(
        self,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        columns: Sequence[str] | None = None,
        transform: Callable[[dict[str, Any]], Mapping[str, Any]] | None = None,
        prefetch: int = DEFAULT_PREFETCH,
        pad: Mapping[str, int] | None = None,
        *,
        rank: int | None = None,
        size: int | None = None,
        num_workers: int | None = None,
        pin_memory: bool = False,
        device: Any = None,
    ) -> Loader:
        """This rank's loader (rank and world size from `hora.environment.current()` unless
        given): batches as dicts of torch tensors by column, made by `num_workers` processes
        (None: a number from the host's cores when there is a `transform`, else none; 0: in the
        training thread); see `hora.data.Loader`."""
        return Loader(
            self,
            batch_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            columns=columns,
            transform=transform,
            prefetch=prefetch,
            pad=pad,
            rank=rank,
            size=size,
            num_workers=num_workers,
            pin_memory=pin_memory,
            device=device,
        )

    def tf_dataset(
        self,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        columns: Sequence[str] | None = None,
        transform: Callable[[dict[str, Any]], Mapping[str, Any]] | None = None,
        prefetch: int = DEFAULT_PREFETCH,
        pad: Mapping[str, int] | None = None,
        epoch: int = 0,
        *,
        rank: int | None = None,
        size: int | None = None,
        num_workers: int | None = None,
    ) -> Any:
        """This rank's share of one epoch as a `tf.data.Dataset` of dicts of tensors, with the
        loader's sharding and order (call again with the next `epoch` for the next one)."""
        loader = self.loader(
            batch_size,
            shuffle,
            seed,
            drop_last,
            columns,
            transform,
            prefetch,
            pad,
            rank=rank,
            size=size,
            num_workers=num_workers,
        )
        return tf_dataset(loader, epoch)


def parquet_files(location: Location) -> list[str]:
    """The Parquet files under a location, sorted, relative to it (Spark's markers left out)."""
    from pyarrow import fs

    filesystem, root = location.arrow()
    info = filesystem.get_file_info(root)
    if info.type == fs.FileType.File:
        return [""]
    found = filesystem.get_file_info(fs.FileSelector(root, recursive=True, allow_not_found=True))
    names = []
    for entry in found:
        relative = entry.path[len(root.rstrip("/")) + 1 :]
        hidden = any(part.startswith(("_", ".")) for part in relative.split("/"))
        if entry.type == fs.FileType.File and not hidden and not relative.endswith(".crc"):
            names.append(relative)
    return sorted(names)


def read_footers(
    location: Location, fingerprint: str = "", pad: Mapping[str, int] | None = None
) -> Dataset:
    """A Dataset from the footers of the Parquet files at `location` (nothing else is read)."""
    filesystem, root = location.arrow()
    files = parquet_files(location)
    if not files:
        raise ValueError(f"{location.uri!r} holds no Parquet files")
    pieces: list[Piece] = []
    schema = None
    paths = [f"{root.rstrip('/')}/{name}" if name else root for name in files]
    for index, (name, footer) in enumerate(zip(files, footers(filesystem, paths), strict=True)):
        if not isinstance(footer, Footer):
            raise footer
        if schema is None:
            schema = footer.schema
        elif not footer.schema.equals(schema):
            raise ValueError(
                f"{location.uri!r}: {name} has the schema {footer.schema}, unlike the first "
                f"file's {schema}; every file of a dataset needs the same columns"
            )
        pieces += [
            Piece(index, g, rows, size) for g, (rows, size) in enumerate(footer.groups) if rows
        ]
    assert schema is not None
    columns = tuple(describe(f) for f in schema)
    uri = location.location()
    return Dataset(uri, tuple(files), tuple(pieces), columns, fingerprint, dict(pad or {}))


def from_parquet(
    path_or_uri: str | os.PathLike[str], pad: Mapping[str, int] | None = None
) -> Dataset:
    """A Dataset over Parquet already written (a file or a directory of files): a local or
    mounted path, a `file:` URI, or any URI pyarrow opens, that every rank reaches."""
    return read_footers(Location.parse(path_or_uri, "dataset"), pad=pad)
