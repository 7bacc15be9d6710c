"""Rows of Arrow tables, gathered and joined the same way wherever a batch is made (the rank's
reader thread, a worker): so that both give the same batches, bit for bit."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa


def gather(table: pa.Table, indices: np.ndarray) -> pa.Table:
    """The rows `indices` of `table`, in that order. A column of several chunks (a window's row
    groups) is gathered chunk by chunk and put in order after: Arrow's own `take` joins every
    chunk of a text or bytes column first, a copy of the whole window for each batch."""
    indices = np.asarray(indices, dtype=np.int64)
    return pa.table([_gather(c, indices) for c in table.columns], schema=table.schema)


def _gather(column: pa.ChunkedArray, indices: np.ndarray) -> pa.Array:
    if column.num_chunks == 1:
        return column.chunk(0).take(pa.array(indices))
    if not len(indices) or not column.num_chunks:
        return pa.array([], type=column.type)
    bounds = np.cumsum([0] + [len(c) for c in column.chunks])
    chunk = np.searchsorted(bounds, indices, side="right") - 1
    by_chunk = np.argsort(chunk, kind="stable")
    ordered, found = chunk[by_chunk], indices[by_chunk]
    cuts = np.flatnonzero(np.diff(ordered)) + 1
    parts = [
        column.chunk(int(ordered[a])).take(pa.array(found[a:b] - bounds[ordered[a]]))
        for a, b in zip([0, *cuts], [*cuts, len(found)], strict=True)
    ]
    grouped = pa.concat_arrays(parts) if len(parts) > 1 else parts[0]
    back = np.empty_like(by_chunk)
    back[by_chunk] = np.arange(len(by_chunk))
    return grouped.take(pa.array(back))


def joined(parts: Sequence[pa.Table]) -> pa.Table:
    """The parts as one table of one chunk per column. Parts whose array columns became
    fixed-size lists of different lengths (row groups of one length each, padded later) are
    joined as plain lists."""
    if len(parts) == 1:
        return parts[0].combine_chunks()
    schemas = {p.schema for p in parts}
    if len(schemas) > 1:
        parts = [_plain_lists(p) for p in parts]
    return pa.concat_tables(parts).combine_chunks()


def _plain_lists(table: pa.Table) -> pa.Table:
    for index, field in enumerate(table.schema):
        if pa.types.is_fixed_size_list(field.type):
            plain = table.column(index).cast(pa.list_(field.type.value_type))
            table = table.set_column(index, field.name, plain)
    return table
