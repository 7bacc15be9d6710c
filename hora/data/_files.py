"""What a Dataset is made of: Parquet files and their row groups, described by their footers.
The loader and its reader read these fields; `Dataset` adds the calls that build them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hora.data._columns import Column
from hora.storage import Location


@dataclass(frozen=True)
class Piece:
    """One Parquet row group: which file, which group, how many rows and (decoded) bytes."""

    file: int
    group: int
    rows: int
    bytes: int


@dataclass(frozen=True)
class Files:
    """Parquet files under `uri` (a path or any URI pyarrow opens), described by their footers:
    what the loader and its reader need of a `Dataset`, below them both."""

    uri: str
    files: tuple[str, ...]  # relative to uri
    pieces: tuple[Piece, ...]
    columns: tuple[Column, ...]
    fingerprint: str = ""
    pad: Mapping[str, int] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.pieces)

    def __len__(self) -> int:
        return self.rows

    @property
    def location(self) -> Location:
        return Location.parse(self.uri, "dataset")

    def delete(self) -> None:
        """Remove the dataset's files (its whole directory, or its one file) from the store."""
        location = self.location
        filesystem, root = location.arrow()
        if self.files == ("",):
            filesystem.delete_file(root)
        else:
            location.delete_dir(root)

    def column(self, name: str) -> Column:
        return {c.name: c for c in self.columns}[name]
