"""Allreduce: a bucket of one tensor is reduced where it lies (no fusion copy); a bucket of many
is packed into one buffer per dtype, reduced once, and handed back as views of that buffer (or
copied back into the callers' tensors when in place). Types the transport lacks, or sums too
imprecise in them, are reduced widened (`dtypes.reduce_dtype`) and cast back."""

from __future__ import annotations

from typing import Any

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from hora.collectives._common import Average
from hora.collectives._data.algorithms import in_place_flags, local_tensors, set_outputs
from hora.collectives._data.dtypes import cast_back_, reduce_dtype, scale_
from hora.collectives._data.fusion import cached_layout
from hora.collectives._data.groups import GroupInfo
from hora.collectives._data.local_op import LocalOp
from hora.collectives._data.op_spec import OpSpec, reduction_mismatch, reduction_parameters
from hora.collectives._data.transports import reads_source, reduce_work, shm_allreduce
from hora.collectives._messages import ALLREDUCE, Bucket, Request
from hora.timeline import hooks as _th
from hora.timeline.hooks import begin_each, end_each

IN, OUT = "MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER"

# (entry index, tensor index within the entry, tensor): one dtype's tensors of a bucket.
Items = list[tuple[int, int, torch.Tensor]]


def run(bucket: Bucket, ops: list[LocalOp | None], info: GroupInfo, device: str) -> None:
    if device == "cpu" and len(ops) > 1 and _run_in_place(bucket, ops, info):
        return
    ref = bucket.entries[0].ref
    names = [e.name for e in bucket.entries]
    inputs = local_tensors(bucket, ops, device)
    outputs: list[list[Any]] = [[None] * len(ts) for ts in inputs]
    by_dtype: dict[torch.dtype, Items] = {}
    for i, ts in enumerate(inputs):
        for j, t in enumerate(ts):
            by_dtype.setdefault(t.dtype, []).append((i, j, t))
    inplace = in_place_flags(ops)
    for dtype, items in by_dtype.items():
        wide = reduce_dtype(dtype, device)
        if len(items) > 1 and wide == dtype and device == "cpu" and _all_in_place(items, inplace):
            _reduce_in_fusion_buffer(names, [t for _, _, t in items], ref, info)
            for i, j, t in items:
                outputs[i][j] = t
        else:
            _reduce_packed(names, items, inplace, outputs, ref, info, device, wide)
    set_outputs(ops, outputs)


def _postscale(ref: Request, info: GroupInfo) -> float:
    return ref.postscale / info.size if ref.op == Average else ref.postscale


def _all_in_place(items: Items, inplace: list[bool]) -> bool:
    return all(inplace[i] for i, _, _ in items)


def _reduce_in_fusion_buffer(
    names: list[str],
    tensors: list[torch.Tensor],
    ref: Request,
    info: GroupInfo,
    layout: tuple[Any, ...] | None = None,
) -> None:
    """In-place CPU tensors of one dtype that reduces as itself, through the set's persistent
    fusion buffer; results copied back into them. With a `layout` (see `FusionBuffer.views`) and
    the set on one host, they go straight into the shared segment instead, and the sum lands in
    the fusion buffer."""
    begin_each(names, IN)
    work, views = info.fusion.views(tensors, layout)
    local = info.local if info.size > 1 else None
    postscale = _postscale(ref, info)
    if layout is not None and local is not None and ref.prescale == 1.0 and local.fits(work.nbytes):
        end_each(names, IN)  # into the shared segment, in the reduction
        shm_allreduce(names, local.allreduce_from_, tensors, layout, work, ref.op, postscale)
    else:
        torch._foreach_copy_(views, tensors)
        scale_(work, ref.prescale)
        end_each(names, IN)
        reduce_work(names, work, ref.op, info, "cpu", postscale)
    begin_each(names, OUT)
    torch._foreach_copy_(tensors, views)
    end_each(names, OUT)


def _reduce_packed(
    names: list[str],
    items: Items,
    inplace: list[bool],
    outputs: list[list[Any]],
    ref: Request,
    info: GroupInfo,
    device: str,
    wide: torch.dtype,
) -> None:
    """Tensors of one dtype, reduced where they lie (one) or packed into a fresh buffer; one
    out of place on shared memory is read where it lies and reduced into a fresh tensor."""
    begin_each(names, IN)
    src = _shared_memory_source(items, inplace, ref, info, device, wide)
    if src is not None:
        work = torch.empty_like(src)
    else:
        work = _pack(items, inplace, wide)
        scale_(work, ref.prescale)
    end_each(names, IN)
    reduce_work(names, work, ref.op, info, device, _postscale(ref, info), src)
    begin_each(names, OUT)
    if len(items) > 1 and wide == items[0][2].dtype:
        _unfuse(work, items, inplace, outputs)
    else:
        _unpack(work, items, inplace, outputs, wide)
    end_each(names, OUT)


def _shared_memory_source(
    items: Items, inplace: list[bool], ref: Request, info: GroupInfo, device: str, wide: torch.dtype
) -> torch.Tensor | None:
    """The one out-of-place tensor that shared memory can read as it is (no clone: a copy of
    the whole tensor saved), else None."""
    if len(items) != 1 or not reads_source(info, device):
        return None
    i, _, t = items[0]
    return None if inplace[i] or wide != t.dtype or ref.prescale != 1.0 else t


def _pack(items: Items, inplace: list[bool], wide: torch.dtype) -> torch.Tensor:
    """The buffer the transport reduces: the tensor itself when alone and in place, else a copy
    (widened to `wide` where the dtype needs it)."""
    if len(items) == 1:
        i, _, t = items[0]
        if wide != t.dtype:
            return t.to(wide)
        return t if inplace[i] else t.clone()
    if wide == items[0][2].dtype:
        return _flatten_dense_tensors([t for _, _, t in items])  # one C++ loop
    work = torch.empty(sum(t.numel() for _, _, t in items), dtype=wide, device=items[0][2].device)
    offset = 0
    for _, _, t in items:
        work[offset : offset + t.numel()].copy_(t.reshape(-1))
        offset += t.numel()
    return work


def _unpack(
    work: torch.Tensor,
    items: Items,
    inplace: list[bool],
    outputs: list[list[Any]],
    wide: torch.dtype,
) -> None:
    """Hand back a reduced buffer of one tensor, or of several widened ones, cast back."""
    offset = 0
    for i, j, t in items:
        piece = work if len(items) == 1 else work[offset : offset + t.numel()].view(t.shape)
        offset += t.numel()
        if inplace[i]:
            if piece is not t:
                cast_back_(t, piece)
            outputs[i][j] = t
        elif wide != t.dtype:
            out = torch.empty_like(t)
            cast_back_(out, piece)
            outputs[i][j] = out
        else:
            outputs[i][j] = piece


def _unfuse(
    work: torch.Tensor, items: Items, inplace: list[bool], outputs: list[list[Any]]
) -> None:
    """Hand a fused buffer back as views shaped like the inputs (made in one C++ loop); in-place
    entries get one `_foreach_copy_` (C++ too): ~1 us of Python per tensor saved twice."""
    tensors = [t for _, _, t in items]
    pieces = _unflatten_dense_tensors(work, tensors)
    if _all_in_place(items, inplace):
        torch._foreach_copy_(tensors, pieces)
        for i, j, t in items:
            outputs[i][j] = t
        return
    for (i, j, t), piece in zip(items, pieces, strict=True):
        if inplace[i]:
            t.copy_(piece)
            outputs[i][j] = t
        else:
            outputs[i][j] = piece


# ----- the common bucket: a training step's gradients --------------------------------------------
def _run_in_place(bucket: Bucket, ops: list[LocalOp | None], info: GroupInfo) -> bool:
    """This rank's CPU tensors, one per entry, of one dtype that reduces as itself, all in place.
    Runs it with none of the general path's per-tensor bookkeeping: on one host the tensors go
    straight into the shared segment and the sum lands in the persistent fusion buffer,
    elsewhere they are packed into that buffer for the transport; False: not such a bucket."""
    tensors = _one_dtype_in_place(ops)
    if tensors is None:
        return False
    names = [e.name for e in bucket.entries] if _th.recorder.enabled else []
    layout = cached_layout(bucket) or (tensors[0].dtype, *[t.shape for t in tensors])
    _reduce_in_fusion_buffer(names, tensors, bucket.entries[0].ref, info, layout)
    for op in ops:
        op.outputs = op.tensors  # type: ignore[union-attr]
    return True


def _one_dtype_in_place(ops: list[LocalOp | None]) -> list[torch.Tensor] | None:
    """The ops' tensors when each op has one, in place, all of one dtype that reduces as itself
    on the CPU; else None."""
    tensors: list[torch.Tensor] = []
    dtype = None
    for op in ops:
        if op is None or not op.inplace or len(op.tensors) != 1:
            return None
        t = op.tensors[0]
        if t.dtype is not dtype:
            if dtype is not None:
                return None
            dtype = t.dtype
        tensors.append(t)
    if dtype is None or reduce_dtype(dtype, "cpu") != dtype:
        return None
    return tensors


SPEC = OpSpec(
    kind=ALLREDUCE,
    run=run,
    fuses_on=reduction_parameters,
    mismatch=reduction_mismatch,
    faces={
        "collectives": (
            "allreduce_",
            "allreduce_async",
            "allreduce_async_",
            "grouped_allreduce_",
            "grouped_allreduce_async",
            "grouped_allreduce_async_",
            "sparse_allreduce_async",
        ),
        "torch": ("allreduce", "grouped_allreduce"),
        "tensorflow": ("allreduce", "grouped_allreduce"),
        "keras": ("allreduce",),
    },
)
