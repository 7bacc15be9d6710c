"""One Parquet file's footer as the paths that read files in place need it (a DataFrame's own
Parquet, a Delta table): its schema, row groups, null counts and what identifies the file."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from hora.data._columns import Column, describe


@dataclass(frozen=True)
class Footer:
    """A file's schema, its row groups as (rows, bytes), and per top-level column asked for the
    nulls of each group (None where the writer kept no count); its size and modification time
    (None where the filesystem does not tell) identify this version of the file."""

    schema: pa.Schema
    groups: tuple[tuple[int, int], ...]
    nulls: dict[str, tuple[int | None, ...]]
    size: int
    mtime_ns: int | None


def read_footer(filesystem: Any, path: str, counted: Iterable[str] = ()) -> Footer:
    """The footer of the file at `path`; FileNotFoundError when the filesystem has none there.
    `counted`: the top-level columns whose null counts are wanted."""
    from pyarrow import fs

    info = filesystem.get_file_info(path)
    if info.type != fs.FileType.File:
        raise FileNotFoundError(path)
    with filesystem.open_input_file(path) as f:
        meta = pq.ParquetFile(f).metadata
    chunk = {meta.schema.column(i).path: i for i in range(meta.num_columns)}
    groups = []
    nulls: dict[str, list[int | None]] = {name: [] for name in counted}
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        groups.append((group.num_rows, max(1, group.total_byte_size)))
        for name, found in nulls.items():
            stats = group.column(chunk[name]).statistics if name in chunk else None
            found.append(stats.null_count if stats is not None and stats.has_null_count else None)
    return Footer(
        meta.schema.to_arrow_schema(),
        tuple(groups),
        {name: tuple(found) for name, found in nulls.items()},
        int(info.size),
        info.mtime_ns,
    )


def columns_of(footer: Footer, wanted: Sequence[tuple[str, str]]) -> list[Column] | str:
    """The loader's view of the (dataset name, file name) columns in this file, named by the
    dataset; or which one the file lacks. A ColumnError names a column no tensor can hold."""
    found = []
    for name, physical in wanted:
        index = footer.schema.get_field_index(physical)
        if index < 0:
            return f"column {physical!r} is not in the file"
        found.append(describe(footer.schema.field(index).with_name(name)))
    return found


def nulls_message(name: str, count: int, fix: str) -> str:
    """The refusal of nulls where a tensor needs numbers, worded as from_spark's."""
    return f"column {name!r} has {count} null rows, which cannot become a tensor: {fix}"
