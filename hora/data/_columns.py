"""Which Arrow columns can become tensors, and how: the checks that name a column and the fix.

A column is a number (one value per row: a 1-D tensor), an array of numbers of one length (a
2-D tensor), or bytes/text (handed to the user's `transform`, never to a tensor by itself).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SCALAR, ARRAY, BYTES = "scalar", "array", "bytes"


@dataclass(frozen=True)
class Column:
    """A column as the loader sees it: its kind, and for arrays the lengths seen (if known)."""

    name: str
    kind: str  # SCALAR, ARRAY or BYTES
    dtype: str  # numpy's name of the values' type ("object" for bytes and text)
    lengths: tuple[int, int] | None = None  # shortest and longest array, when counted


class ColumnError(ValueError):
    """A column that cannot become a tensor; the message names it and says what to do."""


def _numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def describe(field: pa.Field) -> Column:
    """The loader's view of one Parquet column, or a ColumnError saying what to do with it."""
    t = field.type
    if _numeric(t):
        return Column(field.name, SCALAR, t.to_pandas_dtype().__name__)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        if _numeric(t.value_type):
            return Column(field.name, ARRAY, t.value_type.to_pandas_dtype().__name__)
        raise ColumnError(
            f"column {field.name!r} holds arrays of {t.value_type}, which cannot become a "
            "tensor: keep arrays of numbers only (flatten nested arrays, e.g. with "
            "pyspark.sql.functions.flatten), or drop the column before from_spark"
        )
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return Column(field.name, BYTES, "object")
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return Column(field.name, BYTES, "object")
    if pa.types.is_struct(t):
        hint = (
            "an ML vector: convert it with pyspark.ml.functions.vector_to_array"
            if {f.name for f in t} >= {"type", "size", "indices", "values"}
            else "select its fields as columns of their own"
        )
        raise ColumnError(
            f"column {field.name!r} is a struct ({t}), which cannot become a tensor; it is {hint}"
            " before from_spark, or drop it"
        )
    if pa.types.is_map(t):
        raise ColumnError(
            f"column {field.name!r} is a map ({t}), which cannot become a tensor: turn it into "
            "columns or arrays of numbers (or to_json plus a transform), or drop it"
        )
    if pa.types.is_decimal(t):
        raise ColumnError(f"column {field.name!r} is {t}: cast it to double before from_spark")
    if pa.types.is_temporal(t):
        raise ColumnError(
            f"column {field.name!r} is {t}: cast it to a number (e.g. unix_timestamp) or drop it"
        )
    raise ColumnError(f"column {field.name!r} has type {t}, which cannot become a tensor; drop it")


def check_selected(
    columns: Mapping[str, Column], wanted: Sequence[str], has_transform: bool
) -> None:
    """Refuse names that are not columns, and bytes/text that no transform will decode."""
    missing = [c for c in wanted if c not in columns]
    if missing:
        raise ValueError(f"columns {missing} are not in the dataset; it has {list(columns)}")
    text = [c for c in wanted if columns[c].kind == BYTES]
    if text and not has_transform:
        raise ColumnError(
            f"columns {text} hold text or bytes, which cannot become a tensor by themselves: "
            "pass transform= (a function from the batch, a dict of numpy arrays and lists, to "
            "the dict of tensors you want: decode images there), or leave them out with columns="
        )


def to_numpy(
    table: pa.Table, columns: Mapping[str, Column], pad: Mapping[str, int]
) -> dict[str, Any]:
    """One batch as numpy: numbers 1-D, arrays 2-D; bytes and text as Python lists."""
    out: dict[str, Any] = {}
    for name in table.column_names:
        column, data = columns[name], table.column(name)
        if column.kind == BYTES:
            out[name] = data.to_pylist()
            continue
        if data.null_count:
            raise ColumnError(
                f"column {name!r} has {data.null_count} null rows in this batch, which cannot "
                "become a tensor: fill them (DataFrame.fillna) or drop them (dropna(subset="
                f"[{name!r}])) first"
            )
        if column.kind == SCALAR:
            out[name] = data.to_numpy()
        else:
            out[name] = _matrix(name, data.combine_chunks(), pad.get(name))
    return out


def _matrix(name: str, data: Any, pad: int | None) -> np.ndarray:
    """Arrays of one length as rows of a matrix; padded with zeros to `pad` when asked."""
    rows = len(data)
    values = pc.list_flatten(data)
    if values.null_count:
        raise ColumnError(
            f"column {name!r} has null values inside its arrays: fill them before from_spark"
        )
    flat = values.to_numpy(zero_copy_only=False)
    lengths = pc.list_value_length(data).to_numpy(zero_copy_only=False)
    if rows and pad is None and lengths.min() == lengths.max():
        return flat.reshape(rows, int(lengths[0]) if rows else 0)
    if pad is None:
        raise ColumnError(
            f"column {name!r} holds arrays of {lengths.min()} to {lengths.max()} values; a "
            f"tensor needs one length: pass pad={{{name!r}: N}} to pad them with zeros to N, "
            "or make them one length first"
        )
    if rows and lengths.max() > pad:
        raise ColumnError(
            f"column {name!r} holds arrays of up to {lengths.max()} values, more than "
            f"pad={pad}: raise pad to at least {lengths.max()}"
        )
    out = np.zeros((rows, pad), dtype=flat.dtype)
    out[np.arange(pad) < lengths[:, None]] = flat  # row by row, in the values' own order
    return out
