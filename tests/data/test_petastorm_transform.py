"""Petastorm's `TransformSpec` and `workers_count` on the converter's torch loader, without Spark:
Parquet written with pyarrow, read through `make_spark_converter(path)`.

What the func is given (a pandas DataFrame: bytes, numbers, one array a row), the fields and
order it leaves (Petastorm's: the columns less removed and edited ones, then the edit fields;
selected_fields' order when given), the casts and the refusals that name what to change, and
the worker processes `workers_count` starts (and the context's exit ends).
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hora.spark import TransformSpec, make_spark_converter
from hora.spark._petastorm_read import make_loader, read_spec

ROWS = 24


@pytest.fixture(scope="module")
def converter(tmp_path_factory):
    path = tmp_path_factory.mktemp("transform") / "rows.parquet"
    ids = np.arange(ROWS)
    table = pa.table(
        {
            "id": ids,
            "content": pa.array([bytes([i, 0, 255 - i]) for i in ids], pa.binary()),
            "x": pa.array([[float(i), -float(i)] for i in ids], pa.list_(pa.float32())),
            "name": [f"row {i}" for i in ids],
        }
    )
    pq.write_table(table, path, row_group_size=8)
    return make_spark_converter(str(path))


def rows(converter, spec, **kwargs) -> list[dict[str, Any]]:
    kwargs = {"batch_size": 10, "num_epochs": 1, "workers_count": 0, **kwargs}
    with converter.make_torch_dataloader(transform_spec=spec, **kwargs) as loader:
        return list(loader)


def decode(pd_batch):
    """Petastorm's kind of func: a new array column from the bytes, one column dropped."""
    pd_batch["pixels"] = pd_batch["content"].map(lambda b: np.frombuffer(b, np.uint8).copy())
    return pd_batch.drop(columns=["content"])


PIXELS = ("pixels", np.uint8, (3,), False)


def test_func_gets_a_dataframe_of_the_rows(converter):
    """Columns by name: bytes as bytes, text as str, an array column one array a row."""
    seen = []

    def look(pd_batch):
        seen.append(pd_batch.copy())
        return pd_batch

    batch = rows(converter, TransformSpec(look, selected_fields=["id"]), shuffle_row_groups=False)
    frame = seen[0]
    assert list(frame.columns) == ["id", "content", "x", "name"] and len(frame) == 10
    first = frame.iloc[0]
    assert first["content"] == bytes([0, 0, 255]) and first["name"] == "row 0"
    assert isinstance(first["x"], np.ndarray) and first["x"].tolist() == [0.0, -0.0]
    assert list(batch[0]) == ["id"] and batch[0]["id"].tolist() == list(range(10))


def test_fields_in_petastorms_order_without_selected_fields(converter):
    """The read columns less the edited and removed ones, then the edit fields."""
    spec = TransformSpec(decode, edit_fields=[PIXELS], removed_fields=["content", "name"])
    batches = rows(converter, spec)
    assert list(batches[0]) == ["id", "x", "pixels"]
    ids = torch.cat([b["id"] for b in batches])
    pixels = torch.cat([b["pixels"] for b in batches])
    assert sorted(ids.tolist()) == list(range(ROWS))
    assert pixels.dtype == torch.uint8 and pixels.shape == (ROWS, 3)
    assert (pixels[:, 0] == ids).all() and (pixels[:, 2] == 255 - ids).all()
    assert batches[0]["x"].shape == (10, 2)


def test_selected_fields_give_the_order_and_leave_the_rest_out(converter):
    spec = TransformSpec(decode, edit_fields=[PIXELS], selected_fields=["pixels", "name", "id"])
    batch = rows(converter, spec, batch_size=ROWS)[0]
    assert list(batch) == ["pixels", "name", "id"]
    assert batch["name"] == [f"row {i}" for i in batch["id"].tolist()]  # text stays a list


def test_no_func_only_removes(converter):
    batch = rows(converter, TransformSpec(removed_fields=["content", "name"]))[0]
    assert list(batch) == ["id", "x"]


def test_casts_within_a_kind(converter):
    """float64 rows for a float32 field, int64 values for an int32 one: cast, as TF's would."""

    def scaled(pd_batch):
        pd_batch["pixels"] = pd_batch["content"].map(lambda b: np.frombuffer(b, np.uint8) / 255)
        return pd_batch[["pixels", "id"]]

    spec = TransformSpec(
        scaled,
        edit_fields=[("pixels", np.float32, (3,), False), ("id", np.int32, (), False)],
        selected_fields=["pixels", "id"],
    )
    batch = rows(converter, spec)[0]
    assert batch["pixels"].dtype == torch.float32 and batch["id"].dtype == torch.int32


class UnischemaField(NamedTuple):
    """Petastorm's field type, as its edit_fields may hold it (codec before nullable)."""

    name: str
    numpy_dtype: Any
    shape: tuple[int, ...]
    codec: Any = None
    nullable: bool = False


def test_unischema_fields_are_edit_fields(converter):
    field = UnischemaField("pixels", np.uint8, (3,))
    spec = TransformSpec(decode, edit_fields=[field], removed_fields=["content", "name"])
    assert spec.edit_fields[0] == ("pixels", np.dtype(np.uint8), (3,), False)
    assert rows(converter, spec)[0]["pixels"].shape == (10, 3)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"removed_fields": ["a"], "selected_fields": ["b"]}, "not both"),
        ({"edit_fields": [("f", np.float32, (3,))]}, "has 3 items"),
        ({"edit_fields": [("f", "no such dtype", (3,), False)]}, "not a numpy dtype"),
        ({"edit_fields": [("f", np.float32, (None, 3), False)]}, "left open"),
        ({"edit_fields": [("f", np.float32, 3, False)]}, "must be a tuple"),
        ({"edit_fields": [("f", np.str_, (2,), False)]}, "number or bool dtype"),
        ({"edit_fields": [PIXELS, PIXELS]}, "more than once"),
        ({"edit_fields": [object()]}, "neither"),
        ({"func": "decode"}, "callable"),
        ({"selected_fields": "id"}, "list of field names"),
    ],
)
def test_a_bad_spec_is_refused_before_anything_is_read(kwargs, says):
    with pytest.raises(ValueError, match=says):
        TransformSpec(**kwargs)


def returns(frame_of):
    """A func whose DataFrame is `frame_of(pd_batch)`."""
    return lambda pd_batch: frame_of(pd_batch)


DROPPED = {"removed_fields": ["content", "name"]}


@pytest.mark.parametrize(
    ("func", "edit", "names", "says"),
    [
        (returns(lambda b: b), [PIXELS], DROPPED, r"no column \['pixels'\].*return them from func"),
        (returns(decode), [PIXELS], {}, r"no column \['content'\].*in removed_fields"),
        (returns(lambda b: b.assign(extra=1)), [], DROPPED, r"columns \['extra'\] that its spec"),
        (returns(lambda b: b.id.to_numpy()), [], DROPPED, "returned ndarray"),
        (
            returns(lambda b: decode(b).assign(pixels=lambda d: d.pixels.map(lambda p: p[:2]))),
            [PIXELS],
            DROPPED,
            r"row of shape \(2,\), the edit field says \(3,\)",
        ),
        (
            returns(lambda b: decode(b).assign(pixels=lambda d: d.pixels.map(lambda p: p / 2))),
            [PIXELS],
            DROPPED,
            "float64 values where the edit field says uint8",
        ),
        (
            returns(lambda b: decode(b).assign(id=lambda d: d.id / 2)),
            [PIXELS],
            DROPPED,
            r"declare it in edit_fields as \('id', np.float64",
        ),
        (
            returns(lambda b: decode(b).assign(pixels=None)),
            [PIXELS],
            DROPPED,
            "is None in 10 of 10 rows",
        ),
    ],
)
def test_what_func_returns_is_checked(converter, func, edit, names, says):
    spec = TransformSpec(func, edit_fields=edit, **names)
    with pytest.raises(ValueError, match=says):
        rows(converter, spec)


def test_unknown_selected_fields_are_warned_of(converter):
    spec = TransformSpec(selected_fields=["id", "gone"])
    with pytest.warns(UserWarning, match=r"selected_fields \['gone'\]"):
        assert list(rows(converter, spec)[0]) == ["id"]


def test_unknown_removed_fields_are_warned_of(converter):
    with pytest.warns(UserWarning, match=r"removed_fields \['nothing'\]"):
        batch = rows(converter, TransformSpec(removed_fields=["nothing", "content", "name"]))[0]
    assert list(batch) == ["id", "x"]


def test_workers_count_is_the_loaders_num_workers(converter):
    def workers(**kwargs):
        kwargs.setdefault("schema_fields", ["id", "x"])
        spec = read_spec(converter.dataset, 8, 1, kwargs.pop("workers_count", None), 0, kwargs)
        return make_loader(converter.dataset, spec).num_workers

    assert workers(workers_count=3) == 3
    assert workers(workers_count=0) == 0
    assert workers(reader_pool_type="dummy") == 0  # Petastorm's pool of none
    assert workers() == 0  # the loader's default without a transform
    spec = TransformSpec(selected_fields=["id"])
    assert workers(transform_spec=spec) >= 1  # with one: from the host's cores
    with pytest.raises(ValueError, match="workers_count must be an int >= 0"):
        workers(workers_count=-1)
    with pytest.raises(ValueError, match="reader_pool_type must be"):
        workers(reader_pool_type="greenlet")


def with_pid(pd_batch):
    pd_batch["pid"] = os.getpid()
    return pd_batch.drop(columns=["content", "name"])


def test_the_func_runs_in_workers_count_processes(converter):
    spec = TransformSpec(with_pid, edit_fields=[("pid", np.int64, (), False)], **DROPPED)
    with converter.make_torch_dataloader(
        transform_spec=spec, batch_size=4, num_epochs=2, workers_count=2
    ) as loader:
        batches = list(loader)
    pids = {int(p) for b in batches for p in b["pid"]}
    assert len(pids) == 2 and os.getpid() not in pids
    ids = sorted(int(i) for b in batches for i in b["id"])
    assert ids == sorted(list(range(ROWS)) * 2)
