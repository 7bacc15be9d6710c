"""Rows of Arrow tables, gathered and joined the same way wherever a batch is made (the rank's
reader thread, a worker): so that both give the same batches, bit for bit; and the reader's
tables cut into the rank's batches."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa


def gather(table: pa.Table, indices: np.ndarray) -> pa.Table:
    """The rows `indices` of `table`, in that order. A column of several chunks (a window's row
    groups) of bytes, text or arrays is gathered chunk by chunk and put in order after: Arrow's
    own `take` joins every chunk of it first, a copy of the whole window for each batch."""
    indices = np.asarray(indices, dtype=np.int64)
    return pa.table([_gather(c, indices) for c in table.columns], schema=table.schema)


def _gather(column: pa.ChunkedArray, indices: np.ndarray) -> pa.Array | pa.ChunkedArray:
    if column.num_chunks == 1:
        return column.chunk(0).take(pa.array(indices))
    if pa.types.is_primitive(column.type):  # fixed-width values: Arrow's take joins nothing
        return column.take(pa.array(indices))
    if not len(indices) or not column.num_chunks:
        return pa.array([], type=column.type)
    bounds = np.cumsum([0] + [len(c) for c in column.chunks])
    chunk = np.searchsorted(bounds, indices, side="right") - 1
    if _BINARY.get(column.type) is not None and not column.null_count:
        return _gather_values(column, chunk, indices - bounds[chunk])
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


#: bytes and text types, by the type of their offsets
_BINARY = {
    pa.binary(): np.int32,
    pa.string(): np.int32,
    pa.large_binary(): np.int64,
    pa.large_string(): np.int64,
}


def _gather_values(column: pa.ChunkedArray, chunk: np.ndarray, rows: np.ndarray) -> pa.Array:
    """Rows of a bytes or text column of several chunks, each value copied once into the
    result (per chunk takes, then a take putting them in order, would copy them three times:
    a batch of JPEGs is megabytes)."""
    offsets_type = _BINARY[column.type]
    views = []
    for c in column.chunks:
        _, offsets, data = c.buffers()
        first = np.frombuffer(offsets, dtype=offsets_type)[c.offset : c.offset + len(c) + 1]
        views.append((first, memoryview(data) if data is not None else memoryview(b"")))
    starts = np.empty(len(rows), dtype=np.int64)
    ends = np.empty(len(rows), dtype=np.int64)
    for c, (offsets, _) in enumerate(views):
        mine = chunk == c
        starts[mine] = offsets[rows[mine]]
        ends[mine] = offsets[rows[mine] + 1]
    out_offsets = np.zeros(len(rows) + 1, dtype=offsets_type)
    np.cumsum(ends - starts, out=out_offsets[1:])
    values = zip(chunk.tolist(), starts.tolist(), ends.tolist(), strict=True)
    data = b"".join([views[c][1][a:b] for c, a, b in values])
    buffers = [None, pa.py_buffer(out_offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(column.type, len(rows), buffers)


def joined(parts: Sequence[pa.Table]) -> pa.Table:
    """The parts as one table of one chunk per column (see `concatenated`)."""
    return concatenated(parts).combine_chunks()


def concatenated(parts: Sequence[pa.Table]) -> pa.Table:
    """The parts as one table, their chunks as they are. Parts whose array columns became
    fixed-size lists of different lengths (row groups of one length each, padded later) are
    joined as plain lists."""
    if len(parts) == 1:
        return parts[0]
    if len({p.schema for p in parts}) > 1:
        parts = [_plain_lists(p) for p in parts]
    return pa.concat_tables(parts)


def _plain_lists(table: pa.Table) -> pa.Table:
    for index, field in enumerate(table.schema):
        if pa.types.is_fixed_size_list(field.type):
            plain = table.column(index).cast(pa.list_(field.type.value_type))
            table = table.set_column(index, field.name, plain)
    return table


def batches_of(tables: Iterator[tuple[int, pa.Table]], sizes: Sequence[int]) -> Iterator[pa.Table]:
    """The reader's tables (`Reader.tables`) cut into batches of `sizes` rows, in order."""
    pending: list[pa.Table] = []
    held = 0
    for size in sizes:
        while held < size:
            _, table = next(tables)
            pending.append(table)
            held += table.num_rows
        batch, pending, held = _cut(pending, size, held)
        yield batch


def _cut(pending: list[pa.Table], size: int, held: int) -> tuple[pa.Table, list[pa.Table], int]:
    """The first `size` rows of the pending tables as one table, and what is left."""
    parts, rest, taken = [], [], 0
    for table in pending:
        if taken >= size:
            rest.append(table)
            continue
        use = min(size - taken, table.num_rows)
        parts.append(table.slice(0, use))
        if use < table.num_rows:
            rest.append(table.slice(use))
        taken += use
    return joined(parts), rest, held - size
