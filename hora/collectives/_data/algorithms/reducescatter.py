"""Reducescatter: reduce across the set, then rank i keeps the i-th block of rows (the first
`dim0 % size` ranks one row more). Uneven blocks are padded to equal ones for the transport call;
always alone in its bucket."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hora.collectives._common import Average, Sum
from hora.collectives._data.algorithms import zeros_like_request
from hora.collectives._data.dtypes import cast_back_, reduce_dtype, scale_
from hora.collectives._data.groups import GroupInfo
from hora.collectives._data.local_op import LocalOp
from hora.collectives._data.op_spec import OpSpec, reduction_mismatch
from hora.collectives._data.transports import REDUCE_OPS, collective
from hora.collectives._messages import REDUCESCATTER, Bucket, Request

# Newer torch renamed it and warns (FutureWarning, on every rank) at each old-name call.
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def run(bucket: Bucket, ops: list[LocalOp | None], info: GroupInfo, device: str) -> None:
    (entry,) = bucket.entries
    ref = entry.ref
    (op,) = ops
    inputs = op.tensors if op is not None else zeros_like_request(ref, device)
    outs: list[Any] = [_scatter_one(entry.name, t, ref, info, device) for t in inputs]
    if op is not None:
        op.outputs = outs


def _scatter_one(
    name: str, t: torch.Tensor, ref: Request, info: GroupInfo, device: str
) -> torch.Tensor:
    n = info.size
    dtype = t.dtype
    wide = reduce_dtype(dtype, device)
    base, extra = divmod(t.shape[0], n)
    counts = [base + (1 if r < extra else 0) for r in range(n)]
    work = t.to(wide) if wide != dtype else t.clone()
    scale_(work, ref.prescale)
    if n > 1:
        chunk = base + (1 if extra else 0)
        if extra:
            work = _padded(work, counts, chunk)
        out = torch.empty((chunk, *t.shape[1:]), dtype=wide, device=t.device)
        collective(
            [name],
            REDUCESCATTER,
            info,
            device,
            reduce_scatter_single,
            out,
            work,
            op=REDUCE_OPS[ref.op],
        )
        out = out[: counts[info.index]]
    else:
        out = work
    scale_(out, ref.postscale / n if ref.op == Average else ref.postscale)
    if wide != dtype:
        result = torch.empty(out.shape, dtype=dtype, device=t.device)
        cast_back_(result, out)
        out = result
    return out


def _padded(work: torch.Tensor, counts: list[int], chunk: int) -> torch.Tensor:
    """`work`'s blocks of rows (`counts`), each padded with zeros to `chunk` rows."""
    n = len(counts)
    padded = torch.zeros((chunk * n, *work.shape[1:]), dtype=work.dtype, device=work.device)
    start = 0
    for r in range(n):
        padded[r * chunk : r * chunk + counts[r]].copy_(work[start : start + counts[r]])
        start += counts[r]
    return padded


def _average_or_sum(req: Request, members: tuple[int, ...], name: str) -> str | None:
    """Horovod's reducescatter reduces by Average or Sum only."""
    if req.op not in (Average, Sum):
        return f"Reducescatter supports only Average and Sum (tensor '{name}')"
    return None


SPEC = OpSpec(
    kind=REDUCESCATTER,
    run=run,
    mismatch=reduction_mismatch,
    check=_average_or_sum,
    faces={
        "collectives": ("grouped_reducescatter_async", "reducescatter_async"),
        "torch": ("grouped_reducescatter", "reducescatter"),
        "tensorflow": ("grouped_reducescatter", "reducescatter"),
        "keras": ("reducescatter",),
    },
)
