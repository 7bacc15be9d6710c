"""What a Dataset is made of: Parquet files and their row groups, described by their footers.
The loader and its reader read these fields; `Dataset` adds the calls that build them."""

from __future__ import annotations

import builtins
import logging
import os
import socket
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from hora.data._columns import Column
from hora.storage import Location

#: how a Dataset's files came to be (`Files.origin`): hora wrote them (from_spark's copy), or
#: it reads files it does not own (a plain scan's own Parquet, Parquet given by path, a Delta
#: table); `delete()` removes only what hora wrote or was given as Parquet to manage.
WRITTEN, IN_PLACE, PARQUET, DELTA = "written", "in place", "parquet", "delta"

log = logging.getLogger("hora.data")
#: a dataset of more files than this is checked by listing its folder
_ASKED_ONE_BY_ONE = 64


@dataclass(frozen=True)
class Piece:
    """One Parquet row group: which file, which group, how many rows and (decoded) bytes.

    `rows` counts the live rows only: where a Delta deletion vector removes rows of the group,
    `deleted` holds them (see `pack_deleted`) and the reader drops them, so that the epoch's
    order (pure arithmetic on `rows`) never gives out a deleted row.
    """

    file: int
    group: int
    rows: int
    bytes: int
    deleted: builtins.bytes = b""  # `bytes` above is a field

    def kept(self, rows: int) -> np.ndarray:
        """Which of the group's `rows` rows (as stored) are live: a boolean mask."""
        return kept_rows(self.deleted, rows)


def pack_deleted(mask: np.ndarray) -> bytes:
    """A row group's deleted rows (a boolean mask over all its rows) as a few bytes: one bit
    a row, deflated. A run of deleted rows shrinks to almost nothing and a scattered million
    to about a bit each, where ranges or row numbers would grow with every hole: the Dataset
    is pickled into every rank."""
    if not mask.any():
        return b""
    return zlib.compress(np.packbits(mask, bitorder="little").tobytes(), 6)


def kept_rows(deleted: bytes, rows: int) -> np.ndarray:
    """The mask of the rows to keep of a row group of `rows` rows (all when `deleted` is empty)."""
    if not deleted:
        return np.ones(rows, dtype=bool)
    bits = np.frombuffer(zlib.decompress(deleted), dtype=np.uint8)
    return ~np.unpackbits(bits, count=rows, bitorder="little").astype(bool)


@dataclass(frozen=True)
class Files:
    """Parquet files under `uri` (a path or any URI pyarrow opens), described by their footers:
    what the loader and its reader need of a `Dataset`, below them both.

    `renamed` maps a dataset column to the files' column where the names differ (a plain scan's
    `alias`, a Delta table's physical names); `origin` says where the files came from.
    """

    uri: str
    files: tuple[str, ...]  # relative to uri
    pieces: tuple[Piece, ...]
    columns: tuple[Column, ...]
    fingerprint: str = ""
    pad: Mapping[str, int] = field(default_factory=dict)
    renamed: Mapping[str, str] = field(default_factory=dict)
    origin: str = PARQUET

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.pieces)

    def __len__(self) -> int:
        return self.rows

    @property
    def location(self) -> Location:
        return Location.parse(self.uri, "dataset")

    def delete(self) -> None:
        """Remove the dataset's files (its whole directory, or its one file) from the store.

        Files read in place (a DataFrame's own Parquet, a Delta table) are not hora's to remove:
        nothing is deleted then."""
        if self.origin in (IN_PLACE, DELTA):
            log.info(
                "%s is read in place (%s): its files are left as they are", self.uri, self.origin
            )
            return
        location = self.location
        if self.files == ("",):
            location.filesystem().delete_file(location.root)
        else:
            location.remove_tree()

    def unreachable(self) -> tuple[list[str], list[str]]:
        """The files (relative to `uri`) this process does not find, and those it finds but
        may not read. Many files are found by one listing of the folder (an object store
        answers it in pages, where a question per file would take minutes)."""
        from pyarrow import fs

        location = self.location
        filesystem, root = location.arrow()
        paths = [f"{root.rstrip('/')}/{name}" if name else root for name in self.files]
        if len(paths) > _ASKED_ONE_BY_ONE:
            listed = filesystem.get_file_info(
                fs.FileSelector(root, recursive=True, allow_not_found=True)
            )
            there = {i.path for i in listed if i.type == fs.FileType.File}
        else:
            infos = filesystem.get_file_info(paths)
            there = {i.path for i in infos if i.type == fs.FileType.File}
        missing = [n for n, p in zip(self.files, paths, strict=True) if p not in there]
        unreadable = []
        if location.is_local:
            unreadable = [
                n
                for n, p in zip(self.files, paths, strict=True)
                if p in there and not os.access(p, os.R_OK)
            ]
        return missing, unreadable

    def check_reachable(self, rank: int) -> None:
        """Refuse, before any batch, files this rank's host does not see or may not read (a
        folder only the driver's disk holds, another host's /dev/shm), naming the host."""
        missing, unreadable = self.unreachable()
        if not missing and not unreadable:
            return
        here = f"rank {rank} on host {socket.gethostname()!r}"
        count = len(self.files)
        if missing:
            what = f"does not find {len(missing)} of the dataset's {count} files"
            what += f" (e.g. {missing[0]!r})"
        else:
            what = f"may not read {len(unreadable)} of its {count} files (e.g. {unreadable[0]!r})"
        raise FileNotFoundError(
            f"hora.data: {here} {what} under {self.uri}: every rank's host must reach the data. "
            "Put it where the driver and every host read it (a shared mount, or a URI such as "
            "hdfs:// or s3://), or have from_spark write a copy there (copy=True, store=...)"
        )

    def named(self, pieces: Sequence[int]) -> str:
        """Row groups as an error names them."""
        names = []
        for index in dict.fromkeys(pieces):
            piece = self.pieces[index]
            names.append(f"{self.files[piece.file] or self.uri} row group {piece.group}")
        return f"{self.uri}: " + ", ".join(names)

    def column(self, name: str) -> Column:
        return {c.name: c for c in self.columns}[name]
