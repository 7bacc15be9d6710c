"""One Parquet file's footer as the paths that read files in place need it (a DataFrame's own
Parquet, a Delta table): its schema, row groups, null counts and what identifies the file."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from hora.data._columns import Column, describe

#: footers read at once by `read_footers`
FOOTER_THREADS = 16


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


def read_footers(
    filesystem: Any, paths: Sequence[str], counted: Iterable[str] = ()
) -> list[Footer | OSError | ValueError]:
    """Each path's footer, or what reading it raised, in order. On a remote filesystem
    FOOTER_THREADS are read at once (an object store answers each after a round trip); a local
    disk answers at once, and there one thread is faster than several (they would wait for
    the interpreter's lock: 0.8 s against 2 s for 10,000 small files, bench/data.py)."""
    counted = tuple(counted)

    def one(path: str) -> Footer | OSError | ValueError:
        try:
            return read_footer(filesystem, path, counted)
        except (OSError, ValueError) as e:  # not there, not readable, not Parquet to pyarrow
            return e

    from pyarrow import fs

    threads = min(FOOTER_THREADS, len(paths))
    if threads < 2 or isinstance(filesystem, fs.LocalFileSystem):
        return [one(p) for p in paths]
    with ThreadPoolExecutor(threads, thread_name_prefix="hora-data-footers") as pool:
        return list(pool.map(one, paths))


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
