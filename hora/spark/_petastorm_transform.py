"""Petastorm's `TransformSpec` on hora.data's loader: a function of pandas DataFrames, and the
fields it leaves.

Petastorm hands `func` a DataFrame of a row group's rows (bytes columns hold `bytes`, array
columns one numpy array per row) and reads the fields it returns by a schema: the read columns,
less `removed_fields` and the `edit_fields` (which are appended, with the dtype and shape given),
ordered as `selected_fields` when they are given. `SpecTransform` is that, as the loader's
`transform=`: it builds the DataFrame from the loader's batch (a dict of numpy arrays and lists),
calls `func`, checks the DataFrame against those fields and stacks each one into a batch array.
"""

from __future__ import annotations

import collections
import importlib
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from hora.data import Dataset

#: the kinds of dataset columns that become tensors (hora.data's `Column.kind`); the rest are
#: bytes or text, handed on as lists
_TENSOR_KINDS = {"scalar": (), "array": (None,)}


class TransformError(ValueError):
    """A transform_spec, or what its func returned, that does not fit; the message names the
    field and what to change."""


class EditField(NamedTuple):
    """Petastorm's edit-field 4-tuple: a field the func adds or changes."""

    name: str
    numpy_dtype: Any
    shape: tuple[int, ...]
    nullable: bool = False


def edit_field(raw: Any) -> EditField:
    """An edit field from Petastorm's `(name, numpy_dtype, shape, is_nullable)` tuple or an object
    with those attributes (its UnischemaField), checked: one dtype a batch array can hold and
    every dimension given."""
    name, dtype, shape, nullable = _parts(raw)
    if not isinstance(name, str) or not name:
        raise TransformError(f"edit field {raw!r}: its name must be a non-empty str")
    try:
        kind = np.dtype(dtype)
    except TypeError:
        raise TransformError(
            f"edit field {name!r}: numpy_dtype {dtype!r} is not a numpy dtype; give one such as "
            "np.float32, np.int64 or np.uint8"
        ) from None
    shape = _shape(name, shape)
    if kind.kind not in "biuf" and (kind.kind not in "USO" or shape):
        raise TransformError(
            f"edit field {name!r} has numpy_dtype {kind} and shape {shape}: give a number or "
            "bool dtype (str, bytes and object only with shape (), kept as lists)"
        )
    return EditField(name, kind, shape, bool(nullable))


def _parts(raw: Any) -> tuple[Any, Any, Any, Any]:
    if isinstance(raw, tuple) and not hasattr(raw, "numpy_dtype"):
        if len(raw) != 4:
            raise TransformError(
                f"edit field {raw!r} has {len(raw)} items: give (name, numpy_dtype, shape, "
                "is_nullable), e.g. ('features', np.float32, (3, 224, 224), False)"
            )
        return raw[0], raw[1], raw[2], raw[3]
    if all(hasattr(raw, a) for a in ("name", "numpy_dtype", "shape")):
        return raw.name, raw.numpy_dtype, raw.shape, getattr(raw, "nullable", False)
    raise TransformError(
        f"edit field {raw!r} is neither a (name, numpy_dtype, shape, is_nullable) tuple nor "
        "a field with .name, .numpy_dtype and .shape"
    )


def _shape(name: str, shape: Any) -> tuple[int, ...]:
    if isinstance(shape, list):
        shape = tuple(shape)
    if not isinstance(shape, tuple):
        raise TransformError(
            f"edit field {name!r}: shape {shape!r} must be a tuple of ints, () for one value a row"
        )
    if any(d is None for d in shape):
        raise TransformError(
            f"edit field {name!r} has shape {shape} with a dimension left open (None): a batch "
            "array needs one shape; give every dimension (resize or pad in func)"
        )
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise TransformError(f"edit field {name!r}: shape {shape} must hold ints >= 0")
    return shape


def _names(what: str, value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TransformError(f"{what} must be a list of field names, got {value!r}")
    names = list(value)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TransformError(f"{what} must be a list of field names (str), got {bad!r} in it")
    return names


class TransformSpec:
    """Petastorm's `TransformSpec(func, edit_fields, removed_fields, selected_fields)`.

    `func(pd_batch) -> pd_batch` runs on a batch of rows in the loader's worker processes;
    `edit_fields` declares the fields it adds or changes as `(name, numpy_dtype, shape,
    is_nullable)`; `removed_fields` the fields it drops (or that are dropped after it);
    `selected_fields` the fields kept, in that order (Petastorm refuses both of the last two).
    Checked here, before anything is read.
    """

    def __init__(
        self,
        func: Callable[[Any], Any] | None = None,
        edit_fields: Sequence[Any] | None = None,
        removed_fields: Sequence[str] | None = None,
        selected_fields: Sequence[str] | None = None,
    ) -> None:
        if removed_fields is not None and selected_fields is not None:
            raise TransformError(
                "give removed_fields or selected_fields, not both (as Petastorm): "
                "selected_fields alone names every field kept"
            )
        if func is not None and not callable(func):
            raise TransformError(f"func must be a callable or None, got {func!r}")
        if edit_fields is not None and not isinstance(edit_fields, list | tuple):
            raise TransformError(f"edit_fields must be a list of fields, got {edit_fields!r}")
        self.func = func
        self.edit_fields = [edit_field(f) for f in edit_fields or []]
        repeated = _repeated(f.name for f in self.edit_fields)
        if repeated:
            raise TransformError(f"edit_fields name {repeated} more than once: give each once")
        self.removed_fields = _names("removed_fields", removed_fields) or []
        self.selected_fields = _names("selected_fields", selected_fields)

    def __repr__(self) -> str:
        return (
            f"TransformSpec(func={self.func!r}, edit_fields={self.edit_fields!r}, "
            f"removed_fields={self.removed_fields!r}, selected_fields={self.selected_fields!r})"
        )


def _repeated(names: Iterable[str]) -> list[str]:
    return [name for name, times in collections.Counter(names).items() if times > 1]


def as_transform_spec(value: Any) -> TransformSpec:
    """`transform_spec=` as a TransformSpec (another object with its four attributes is read
    through them, and checked the same)."""
    if isinstance(value, TransformSpec):
        return value
    attributes = ("func", "edit_fields", "removed_fields", "selected_fields")
    if not all(hasattr(value, a) for a in attributes):
        raise TransformError(
            f"transform_spec must be a TransformSpec (from hora.spark import TransformSpec), "
            f"got {value!r}"
        )
    removed = value.removed_fields or None
    return TransformSpec(value.func, value.edit_fields, removed, value.selected_fields)


@dataclass(frozen=True)
class Field:
    """One field the transform gives: a batch array of `dtype` and rows of `shape` (a None
    dimension: any length, one per batch), or with `dtype` None a list of values."""

    name: str
    dtype: np.dtype | None
    shape: tuple[int | None, ...]
    edited: bool


def plan(spec: TransformSpec, dataset: Dataset, read: Sequence[str]) -> SpecTransform:
    """The loader's transform for `spec` over the `read` columns of `dataset`, with Petastorm's
    fields and order (names it does not know are warned of and ignored, as Petastorm does)."""
    _pandas()  # missing, it fails here rather than in a worker
    columns = {c.name: c for c in dataset.columns}
    unknown = [n for n in spec.removed_fields if n not in read]
    if unknown:
        warnings.warn(
            f"removed_fields {unknown} are not among the columns read {list(read)}: ignored",
            stacklevel=4,  # the caller of make_torch_dataloader or make_tf_dataset
        )
    edits = {f.name: f for f in spec.edit_fields}
    dropped = set(edits) | set(spec.removed_fields)
    names = [n for n in read if n not in dropped] + list(edits)
    if spec.selected_fields is not None:
        unknown = [n for n in spec.selected_fields if n not in names]
        if unknown:
            warnings.warn(
                f"selected_fields {unknown} are neither columns read {list(read)} nor edit "
                "fields: ignored",
                stacklevel=4,  # the caller of make_torch_dataloader or make_tf_dataset
            )
        names = [n for n in dict.fromkeys(spec.selected_fields) if n in names]
    if not names:
        raise TransformError(
            "the transform_spec keeps no field: name at least one column or edit field in "
            "selected_fields, or remove fewer"
        )
    fields = []
    for name in names:
        if name in edits:
            e = edits[name]
            dtype = None if e.numpy_dtype.kind in "USO" else e.numpy_dtype
            fields.append(Field(name, dtype, e.shape, True))
        else:
            column = columns[name]
            shape = _TENSOR_KINDS.get(column.kind)
            tensor = shape is not None
            dtype = np.dtype(column.dtype) if tensor else None
            fields.append(Field(name, dtype, shape or (), False))
    selects = spec.selected_fields is not None
    return SpecTransform(spec.func, tuple(spec.removed_fields), tuple(fields), selects)


@dataclass(frozen=True)
class SpecTransform:
    """A TransformSpec as hora.data's `Loader(transform=...)`: from the loader's batch to the
    DataFrame `func` takes, and from the DataFrame it returns to one array (or list) a field.
    With `selects` (selected_fields given) other returned columns are left out; without, each
    must be a field or removed."""

    func: Callable[[Any], Any] | None
    removed: tuple[str, ...]
    fields: tuple[Field, ...]
    selects: bool

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        frame = to_frame(batch)
        if self.func is not None:
            frame = self.func(frame)
            if not _is_frame(frame):
                raise TransformError(
                    f"transform_spec's func returned {type(frame).__name__}: return the pandas "
                    "DataFrame it was given, changed (Petastorm's func maps a DataFrame to one)"
                )
        self._check_columns([str(c) for c in frame.columns])
        return {f.name: _values(f, frame[f.name]) for f in self.fields}

    def _check_columns(self, returned: list[str]) -> None:
        repeated = _repeated(returned)
        if repeated:
            raise TransformError(f"transform_spec's func returned columns {repeated} twice")
        missing = [f for f in self.fields if f.name not in returned]
        if missing:
            names = [f.name for f in missing]
            fix = (
                "leave them out of selected_fields"
                if self.selects
                else "name the columns it drops in removed_fields"
            )
            if any(f.edited for f in missing):
                fix = f"return them from func, or {fix} (and edit_fields)"
            raise TransformError(
                f"transform_spec's func returned no column {names} (it returned {returned}): "
                f"the spec gives {self.names}; {fix}"
            )
        extra = [n for n in returned if n not in self.names and n not in self.removed]
        if extra and not self.selects:
            raise TransformError(
                f"transform_spec's func returned columns {extra} that its spec does not give: "
                "declare new ones in edit_fields (name, numpy_dtype, shape, is_nullable), name "
                "the others in removed_fields, or drop them in func (pd_batch.drop(columns=...))"
            )


def _pandas() -> Any:
    try:
        return importlib.import_module("pandas")
    except ImportError:
        raise ImportError(
            "transform_spec hands its func a pandas DataFrame: install pandas (pip install "
            "pandas) in the ranks' environment"
        ) from None


def _is_frame(value: Any) -> bool:
    return isinstance(value, _pandas().DataFrame)


def to_frame(batch: Mapping[str, Any]) -> Any:
    """The loader's batch as Petastorm's DataFrame: 2-D arrays become one array a row."""
    pd = _pandas()
    data = {}
    for name, value in batch.items():
        if isinstance(value, np.ndarray) and value.ndim > 1:
            cells = np.empty(len(value), dtype=object)
            for i, row in enumerate(value):
                cells[i] = row
            value = cells
        data[name] = pd.Series(value, dtype=object if isinstance(value, list) else None)
    return pd.DataFrame(data)


def _values(field: Field, series: Any) -> Any:
    """One returned column as the field says: a list, or an array (rows, *shape) of its dtype."""
    cells = series.to_numpy()
    if field.dtype is None:
        return list(cells)
    nulls = sum(1 for c in cells if c is None) if cells.dtype == object else 0
    if nulls:
        raise TransformError(
            f"field {field.name!r} is None in {nulls} of {len(cells)} rows: a batch array "
            "cannot hold None (is_nullable does not change that); give every row a value"
        )
    if field.shape == ():
        array = _from_objects(field, cells) if cells.dtype == object else cells
    else:
        rows = [np.asarray(c) for c in cells]
        for row in rows:
            if not _fits(row.shape, field.shape):
                raise TransformError(
                    f"field {field.name!r}: func returned a row of shape {row.shape}, the "
                    f"{_source(field)} says {field.shape}: make every row that shape, or change "
                    "the edit field's shape"
                )
        if not rows:
            return np.empty((0, *(d or 0 for d in field.shape)), dtype=field.dtype)
        if len({r.shape for r in rows}) > 1:
            raise TransformError(
                f"field {field.name!r}: func returned rows of shapes "
                f"{sorted({r.shape for r in rows})}: a batch array needs one; make them one "
                "length, or declare the field in edit_fields with its shape"
            )
        array = np.stack(rows)
    if array.ndim != 1 + len(field.shape):
        raise TransformError(
            f"field {field.name!r}: func returned rows of shape {array.shape[1:]}, the "
            f"{_source(field)} says {field.shape}: make every row that shape, or change the "
            "edit field's shape"
        )
    return _cast(field, array)


def _fits(found: tuple[int, ...], wanted: tuple[int | None, ...]) -> bool:
    if len(found) != len(wanted):
        return False
    return all(w is None or f == w for f, w in zip(found, wanted, strict=True))


def _source(field: Field) -> str:
    return "edit field" if field.edited else "dataset's column (not in edit_fields)"


def _from_objects(field: Field, cells: np.ndarray) -> np.ndarray:
    """A column of Python values as an array numpy infers (then cast as for any array)."""
    try:
        array = np.array(cells.tolist())
    except ValueError:
        array = cells
    if array.dtype == object:
        kinds = sorted({type(c).__name__ for c in cells})
        raise TransformError(
            f"field {field.name!r}: func returned values of type {kinds}, not numbers of one "
            f"shape: return {field.dtype} values of shape {field.shape}"
        )
    return array


def _cast(field: Field, array: np.ndarray) -> np.ndarray:
    """The field's dtype: a cast within a kind (float64 to float32, int64 to int32, bool or int to
    float) is made; one that changes the kind (float to int) is refused, naming the fix."""
    assert field.dtype is not None
    if array.dtype == field.dtype:
        return array
    if np.can_cast(array.dtype, field.dtype, "same_kind"):
        return array.astype(field.dtype)
    change = (
        "or change the edit field's numpy_dtype"
        if field.edited
        else f"or declare it in edit_fields as ({field.name!r}, np.{array.dtype}, "
        f"{field.shape}, False)"
    )
    raise TransformError(
        f"field {field.name!r}: func returned {array.dtype} values where the {_source(field)} "
        f"says {field.dtype}: return {field.dtype} (.astype(np.{field.dtype})) {change}"
    )
