"""The per-operation algorithms (Horovod's `ops/*_operations.cc`): how one negotiated bucket of
each kind is packed, moved through a transport (`transports`) and handed back.

Each module's `run(bucket, ops, info, device)` runs one bucket on this rank; `ops[i]` is what this
rank submitted for the bucket's i-th entry (None when it joined: it contributes zeros), and the
results land in each op's `outputs`. Each module also declares the op's `SPEC`
(`op_spec.OpSpec`: everything else hora knows of the op), which `registry` finds there: a new op
is a new module here. This module holds what they share.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from hora.collectives._data.dtypes import dtype_from_name
from hora.collectives._data.local_op import LocalOp
from hora.collectives._messages import Bucket, Request


def device_of(device: str) -> torch.device:
    """The torch device of a request's device name ("cuda": the current GPU)."""
    if device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def zeros_like_request(req: Request, device: str) -> list[torch.Tensor]:
    """A joined rank's contribution: zeros shaped like the others' tensors."""
    dev = device_of(device)
    return [
        torch.zeros(shape, dtype=dtype_from_name(dt), device=dev)
        for dt, shape in zip(req.dtypes, req.shapes, strict=True)
    ]


def local_tensors(
    bucket: Bucket, ops: list[LocalOp | None], device: str
) -> list[list[torch.Tensor]]:
    """This rank's tensors for each entry: its own, or zeros where it joined."""
    return [
        op.tensors if op is not None else zeros_like_request(entry.ref, device)
        for entry, op in zip(bucket.entries, ops, strict=True)
    ]


def row_bytes(shape: tuple[int, ...], dtype: str) -> int:
    """Bytes of one row (dim 0) of a tensor shaped `shape`."""
    return math.prod(shape[1:]) * dtype_from_name(dtype).itemsize


def in_place_flags(ops: list[LocalOp | None]) -> list[bool]:
    """Whether this rank asked for each entry's result in its own tensors (worked out once per
    bucket: the loops over its tensors then index a list)."""
    return [op is not None and op.inplace for op in ops]


def set_outputs(ops: list[LocalOp | None], outputs: list[list[Any]]) -> None:
    for op, outs in zip(ops, outputs, strict=True):
        if op is not None:
            op.outputs = outs
