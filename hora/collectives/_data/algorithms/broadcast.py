"""Broadcast: the root's tensors to every rank of the set. One tensor is sent where it lies (or
into a fresh tensor when out of place); several are packed into one byte buffer, each aligned."""

from __future__ import annotations

from typing import Any

import torch

from hora.collectives._data.algorithms import in_place_flags, local_tensors, set_outputs
from hora.collectives._data.dtypes import as_bytes
from hora.collectives._data.fusion import aligned
from hora.collectives._data.groups import GroupInfo
from hora.collectives._data.local_op import LocalOp
from hora.collectives._data.op_spec import OpSpec
from hora.collectives._data.transports import broadcast_work
from hora.collectives._messages import BROADCAST, Bucket, Request
from hora.timeline.hooks import begin_each, end_each

# (entry index, tensor index within the entry, tensor)
Items = list[tuple[int, int, torch.Tensor]]


def run(bucket: Bucket, ops: list[LocalOp | None], info: GroupInfo, device: str) -> None:
    names = [e.name for e in bucket.entries]
    root = bucket.entries[0].ref.root
    is_root = info.ranks[info.index] == root
    inputs = local_tensors(bucket, ops, device)
    items = [(i, j, t) for i, ts in enumerate(inputs) for j, t in enumerate(ts)]
    outputs: list[list[Any]] = [[None] * len(ts) for ts in inputs]
    inplace = in_place_flags(ops)
    if len(items) == 1:
        i, j, t = items[0]
        out = t if inplace[i] else _fresh(t, is_root)
        if info.size > 1 and out.numel():
            broadcast_work(names, as_bytes(out), root, info, device)
        outputs[i][j] = out
    else:
        _run_fused(names, items, inplace, outputs, info, device, root, is_root)
    set_outputs(ops, outputs)


def _fresh(t: torch.Tensor, is_root: bool) -> torch.Tensor:
    """An out-of-place result: the root's is a copy (its source stays untouched)."""
    return t.clone() if is_root else torch.empty_like(t)


def _run_fused(
    names: list[str],
    items: Items,
    inplace: list[bool],
    outputs: list[list[Any]],
    info: GroupInfo,
    device: str,
    root: int,
    is_root: bool,
) -> None:
    offsets, pos = [], 0
    for _, _, t in items:
        offsets.append(pos)
        pos = aligned(pos + t.numel() * t.element_size())
    begin_each(names, "MEMCPY_IN_FUSION_BUFFER")
    buf = torch.empty(pos, dtype=torch.uint8, device=items[0][2].device)
    if is_root:
        for (_, _, t), o in zip(items, offsets, strict=True):
            buf[o : o + t.numel() * t.element_size()].copy_(as_bytes(t))
    end_each(names, "MEMCPY_IN_FUSION_BUFFER")
    if info.size > 1:
        broadcast_work(names, buf, root, info, device)
    begin_each(names, "MEMCPY_OUT_FUSION_BUFFER")
    for (i, j, t), o in zip(items, offsets, strict=True):
        piece = buf[o : o + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
        if inplace[i]:
            if not is_root:
                t.copy_(piece)
            outputs[i][j] = t
        else:
            outputs[i][j] = t.clone() if is_root else piece
    end_each(names, "MEMCPY_OUT_FUSION_BUFFER")


def _root(req: Request) -> tuple[object, ...]:
    """Broadcasts fuse when they share a root."""
    return (req.root,)


def _root_mismatch(first: Request, req: Request, where: str) -> str | None:
    """Every rank names the same root."""
    if req.root != first.root:
        return "Mismatched broadcast root ranks: " + where.format(a=first.root, b=req.root)
    return None


def _root_in_set(req: Request, members: tuple[int, ...], name: str) -> str | None:
    """The root is a member of the set the broadcast runs in."""
    if req.root not in members:
        return f"Broadcast root rank {req.root} is not in the process set (tensor '{name}')"
    return None


SPEC = OpSpec(
    kind=BROADCAST,
    run=run,
    fuses_on=_root,
    mismatch=_root_mismatch,
    check=_root_in_set,
    join_refusal="Broadcast is not supported with Join at this time.",
    faces={
        "collectives": ("broadcast_", "broadcast_async", "broadcast_async_"),
        "torch": ("broadcast",),
        "tensorflow": ("broadcast",),
        "keras": ("broadcast",),
    },
)
