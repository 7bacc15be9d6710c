"""`TorchModel.transform`'s work in the executors: Arrow batches in, the model's outputs appended.

The model travels once per executor as a broadcast variable and is unpickled once per Python
worker (kept in `_MODELS` while Spark reuses the worker), on the task's GPU when Spark gave it
one, else on CUDA when there is one, else on the CPU. Rows go through the model
`batch_size` at a time, straight from Arrow buffers into tensors (no pandas in between).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from hora.spark.estimator.columns import ColumnSpec, to_numpy
from hora.spark.estimator.train import as_outputs

_MODELS: dict[str, tuple[Any, Any]] = {}


def _device() -> Any:
    import torch
    from pyspark import TaskContext

    context = TaskContext.get()
    gpus = context.resources().get("gpu") if context is not None else None
    if gpus is not None and gpus.addresses and torch.cuda.is_available():
        return torch.device("cuda", int(gpus.addresses[0]))
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _model(token: str, broadcast: Any) -> tuple[Any, Any]:
    found = _MODELS.get(token)
    if found is None:
        import cloudpickle

        device = _device()
        model = cloudpickle.loads(broadcast.value).to(device).eval()
        _MODELS.clear()  # one model per worker at a time: a new transform replaces the old one
        found = _MODELS[token] = (model, device)
    return found


def predict(
    batches: Iterator[Any],
    *,
    broadcast: Any,
    token: str,
    specs: Sequence[ColumnSpec],
    inputs: Sequence[str],
    temporary: Sequence[str],
    outputs: Sequence[str],
    kinds: Sequence[str],
    batch_size: int,
) -> Iterator[Any]:
    """mapInArrow's function: each RecordBatch with `outputs` added (and `temporary` dropped).

    `inputs` are the feature columns in the batch, read as float32 (vectors arrive as arrays in
    `temporary` columns made for this)."""
    import pyarrow as pa
    import torch

    model, device = _model(token, broadcast)
    for batch in batches:
        arrays = [
            to_numpy(batch.column(name), s).astype(np.float32, copy=False)
            for name, s in zip(inputs, specs, strict=True)
        ]
        rows = batch.num_rows
        results: list[list[np.ndarray]] = [[] for _ in outputs]
        with torch.inference_mode(), warnings.catch_warnings():
            # Arrow's buffers are read-only and torch says so; inference never writes to them.
            warnings.simplefilter("ignore", UserWarning)
            for start in range(0, rows, batch_size):
                xs = [torch.from_numpy(a[start : start + batch_size]).to(device) for a in arrays]
                for i, out in enumerate(as_outputs(model(*xs), len(outputs))):
                    results[i].append(out.detach().float().cpu().numpy().reshape(len(xs[0]), -1))
        keep = [i for i, name in enumerate(batch.schema.names) if name not in set(temporary)]
        columns = [batch.column(i) for i in keep]
        names = [batch.schema.names[i] for i in keep]
        for name, kind, parts in zip(outputs, kinds, results, strict=True):
            values = np.concatenate(parts) if parts else np.zeros((0, 1), np.float32)
            columns.append(_arrow(values, kind, pa))
            names.append(name)
        yield pa.RecordBatch.from_arrays(columns, names=names)


def _arrow(values: np.ndarray, kind: str, pa: Any) -> Any:
    if kind == "double":
        return pa.array(values.reshape(-1).astype(np.float64))
    width = values.shape[1]
    offsets = pa.array(np.arange(0, (len(values) + 1) * width, width, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(values.reshape(-1).astype(np.float32)))
