"""`TorchModel.transform`'s work: feature arrays in, the model's outputs out, `batch_size` rows at
a time; in the executors on Arrow batches (`predict`), or on the driver for a pandas DataFrame
(`predict_pandas`, what a `pyspark.ml.connect` pipeline may hand a stage).

In the executors, the model arrives as `shipping` sent it and is unpickled once per Python worker
(kept in `_MODELS` while Spark reuses the worker), on the task's GPU when Spark gave it one, else
on CUDA when there is one, else on the CPU. Arrow buffers go straight into tensors (no pandas in
between).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from hora.spark.estimator.columns import ColumnSpec, to_numpy
from hora.spark.estimator.shipping import Shipped
from hora.spark.estimator.train import as_outputs

_MODELS: dict[str, tuple[Any, Any]] = {}


def device() -> Any:
    import torch
    from pyspark import TaskContext

    context = TaskContext.get()
    gpus = context.resources().get("gpu") if context is not None else None
    if gpus is not None and gpus.addresses and torch.cuda.is_available():
        return torch.device("cuda", int(gpus.addresses[0]))
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _model(shipped: Shipped) -> tuple[Any, Any]:
    found = _MODELS.get(shipped.token)
    if found is None:
        import cloudpickle

        where = device()
        model = cloudpickle.loads(shipped.payload()).to(where).eval()
        _MODELS.clear()  # one model per worker at a time: a new transform replaces the old one
        found = _MODELS[shipped.token] = (model, where)
    return found


def outputs_of(
    model: Any, where: Any, arrays: Sequence[np.ndarray], n_outputs: int, batch_size: int
) -> list[np.ndarray]:
    """The model's outputs on `arrays` (one float32 array per feature column, rows first):
    one (rows, values per row) float32 array per output."""
    import torch

    rows = len(arrays[0])
    results: list[list[np.ndarray]] = [[] for _ in range(n_outputs)]
    with torch.inference_mode(), warnings.catch_warnings():
        # Arrow's buffers are read-only and torch says so; inference never writes to them.
        warnings.simplefilter("ignore", UserWarning)
        for start in range(0, rows, batch_size):
            xs = [torch.from_numpy(a[start : start + batch_size]).to(where) for a in arrays]
            for i, out in enumerate(as_outputs(model(*xs), n_outputs)):
                results[i].append(out.detach().float().cpu().numpy().reshape(len(xs[0]), -1))
    return [np.concatenate(p) if p else np.zeros((0, 1), np.float32) for p in results]


def predicted_class(values: np.ndarray) -> np.ndarray:
    """Each row's index of its largest value, as doubles (what classification evaluators read)."""
    return values.argmax(axis=1).astype(np.float64)


def predict(
    batches: Iterator[Any],
    *,
    shipped: Shipped,
    specs: Sequence[ColumnSpec],
    inputs: Sequence[str],
    temporary: Sequence[str],
    outputs: Sequence[str],
    kinds: Sequence[str],
    prediction: str | None,
    batch_size: int,
) -> Iterator[Any]:
    """mapInArrow's function: each RecordBatch with `outputs` (and `prediction`, the first
    output's largest index, when named) added and `temporary` dropped.

    `inputs` are the feature columns in the batch, read as float32 (vectors arrive as arrays in
    `temporary` columns made for this)."""
    import pyarrow as pa

    model, where = _model(shipped)
    for batch in batches:
        arrays = [
            to_numpy(batch.column(name), s).astype(np.float32, copy=False)
            for name, s in zip(inputs, specs, strict=True)
        ]
        results = outputs_of(model, where, arrays, len(outputs), batch_size)
        keep = [i for i, name in enumerate(batch.schema.names) if name not in set(temporary)]
        columns = [batch.column(i) for i in keep]
        names = [batch.schema.names[i] for i in keep]
        for name, kind, values in zip(outputs, kinds, results, strict=True):
            columns.append(_arrow(values, kind, pa))
            names.append(name)
        if prediction is not None:
            columns.append(pa.array(predicted_class(results[0])))
            names.append(prediction)
        yield pa.RecordBatch.from_arrays(columns, names=names)


def _arrow(values: np.ndarray, kind: str, pa: Any) -> Any:
    if kind == "double":
        return pa.array(values.reshape(-1).astype(np.float64))
    width = values.shape[1]
    offsets = pa.array(np.arange(0, (len(values) + 1) * width, width, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(values.reshape(-1).astype(np.float32)))


def predict_pandas(
    frame: Any,
    model: Any,
    specs: Sequence[ColumnSpec],
    outputs: Sequence[str],
    kinds: Sequence[str],
    prediction: str | None,
    batch_size: int,
) -> Any:
    """A shallow copy of the pandas DataFrame `frame` with the outputs added, computed here."""
    from pyspark.ml.linalg import DenseVector

    arrays = [pandas_to_numpy(frame[s.name], s) for s in specs]
    where = device()
    results = outputs_of(model.to(where).eval(), where, arrays, len(outputs), batch_size)
    out = frame.copy(deep=False)
    for name, kind, values in zip(outputs, kinds, results, strict=True):
        if kind == "double":
            out[name] = values.reshape(-1).astype(np.float64)
        elif kind == "vector":
            out[name] = [DenseVector(row) for row in values.astype(np.float64)]
        else:
            out[name] = list(values)
    if prediction is not None:
        out[prediction] = predicted_class(results[0])
    return out


def pandas_to_numpy(series: Any, spec: ColumnSpec) -> np.ndarray:
    """A pandas column (numbers, or lists, arrays or ml vectors per row) as float32 of shape
    (rows, *spec.shape)."""
    if series.isna().any():
        raise ValueError(f"column {spec.name!r} has null rows; drop or fill them first")
    if spec.kind == "scalar":
        return series.to_numpy(np.float32).reshape((len(series), *spec.shape))
    rows = [np.asarray(value, dtype=np.float32).reshape(-1) for value in series]
    flat = np.stack(rows) if rows else np.zeros((0, 0), np.float32)
    return flat.reshape((len(series), *spec.shape))
