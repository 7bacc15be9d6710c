"""Spark columns in: which ones a model can read, and the one cast that makes them its numbers
(float32, int64 labels, fixed-length float arrays; ML vectors through vector_to_array).

Training writes the cast columns through `hora.data.from_spark`, whose column checks (nulls,
arrays of one length, no rows) and Arrow-to-NumPy conversion then apply; this module is what
comes before the cast (Spark's and pandas' types, the user's shapes), and the conversion of the
inference UDF's Arrow batches and the driver's sample, which read the same cast columns."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ColumnSpec:
    """One feature or label column as the ranks and the inference UDF read it."""

    name: str
    kind: str  # "scalar", "array" or "vector" (pyspark.ml.linalg), as found in the DataFrame
    integral: bool  # an integer label stays int64 (class indices for cross_entropy)
    shape: tuple[int, ...] = ()  # one row's shape; () for a scalar

    def with_shape(self, shape: tuple[int, ...]) -> ColumnSpec:
        return ColumnSpec(self.name, self.kind, self.integral, shape)


def describe(df: Any, names: list[str], role: str) -> list[ColumnSpec]:
    """The spec of each named column, or a ValueError naming the column and what to do."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T

    fields = {f.name: f.dataType for f in df.schema.fields}
    specs = []
    for name in names:
        if name not in fields:
            raise ValueError(
                f"{role} column {name!r} is not in the DataFrame; its columns are {sorted(fields)}"
            )
        dtype = fields[name]
        if isinstance(dtype, T.NumericType | T.BooleanType):
            integral = isinstance(dtype, T.IntegralType | T.BooleanType)
            specs.append(ColumnSpec(name, "scalar", integral))
        elif isinstance(dtype, T.ArrayType) and isinstance(dtype.elementType, T.NumericType):
            specs.append(ColumnSpec(name, "array", False))
        elif isinstance(dtype, VectorUDT):
            specs.append(ColumnSpec(name, "vector", False))
        else:
            raise ValueError(
                f"{role} column {name!r} has type {dtype.simpleString()}; a model reads numeric, "
                "array<numeric> or ml vector columns: cast it, or assemble it with "
                "VectorAssembler"
            )
    return specs


def is_pandas(dataset: Any) -> bool:
    """A pandas DataFrame (what a pyspark.ml.connect pipeline may hand a stage), found without
    importing pandas where the program has not."""
    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(dataset, pandas.DataFrame)


def describe_pandas(frame: Any, names: list[str], role: str) -> list[ColumnSpec]:
    """`describe` for a pandas DataFrame (what a `pyspark.ml.connect` pipeline may hand a stage):
    numeric columns are scalars, columns of lists, arrays or ml vectors are arrays."""
    specs = []
    for name in names:
        if name not in frame.columns:
            raise ValueError(
                f"{role} column {name!r} is not in the DataFrame; its columns are "
                f"{sorted(map(str, frame.columns))}"
            )
        kind = frame[name].dtype.kind  # NumPy's: b(ool), i(nt), u(nsigned), f(loat), O(bject)
        if kind in "biuf":
            specs.append(ColumnSpec(name, "scalar", kind in "biu"))
        elif kind == "O":
            specs.append(ColumnSpec(name, "array", False))
        else:
            raise ValueError(
                f"{role} column {name!r} has dtype {frame[name].dtype}; a model reads numbers, "
                "or lists, arrays or ml vectors of numbers"
            )
    return specs


def numeric_column(spec: ColumnSpec, alias: str) -> Any:
    """The Spark expression that gives the column as float32 values (int64 for integer labels):
    a scalar, or a fixed-length array<float>."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    if spec.kind == "vector":
        return vector_to_array(F.col(spec.name), "float32").alias(alias)
    if spec.kind == "array":
        return F.col(spec.name).cast("array<float>").alias(alias)
    return F.col(spec.name).cast("long" if spec.integral else "float").alias(alias)


def to_numpy(column: Any, spec: ColumnSpec) -> np.ndarray:
    """An Arrow column (as `numeric_column` made it) as an array of shape (rows, *spec.shape)."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    rows = len(column)
    if spec.kind == "scalar":
        values = column.to_numpy(zero_copy_only=False)
        return values.reshape((rows, *spec.shape)) if spec.shape else values
    if column.null_count:
        raise ValueError(f"column {spec.name!r} has null rows; drop or fill them first")
    flat = column.flatten().to_numpy(zero_copy_only=False)
    return flat.reshape((rows, *spec.shape))
