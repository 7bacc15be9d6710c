"""Allgather: every rank's rows of each tensor, concatenated on dim 0 in rank order.

Ranks may contribute different numbers of rows, so each rank's segment holds its tensors' bytes,
each aligned, padded to the longest segment; one transport call gathers the segments and the rows
are cut back out. One tensor of equal sizes everywhere is gathered straight into its output.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from hora.collectives._data.algorithms import device_of, local_tensors, row_bytes, set_outputs
from hora.collectives._data.dtypes import as_bytes, dtype_from_name
from hora.collectives._data.fusion import aligned
from hora.collectives._data.groups import GroupInfo
from hora.collectives._data.local_op import LocalOp
from hora.collectives._data.op_spec import OpSpec
from hora.collectives._data.transports import gather_work
from hora.collectives._messages import ALLGATHER, Bucket, Request
from hora.timeline.hooks import begin_each, end_each


class Layout(NamedTuple):
    """Where each rank's rows of each tensor lie in the gathered buffer."""

    specs: list[tuple[int, int, str, tuple[int, ...]]]  # (entry, tensor, dtype, shape on rank 0)
    rows: list[list[int]]  # rows[r][k]: rows rank r gives the k-th tensor (0 when joined)
    row_bytes: list[int]  # per tensor
    offsets: list[list[int]]  # offsets[r][k]: byte offset of rank r's k-th tensor in its segment
    segment: int  # bytes per rank, the longest segment


def layout(bucket: Bucket, info: GroupInfo) -> Layout:
    specs = [
        (i, j, dt, shape)
        for i, entry in enumerate(bucket.entries)
        for j, (dt, shape) in enumerate(zip(entry.ref.dtypes, entry.ref.shapes, strict=True))
    ]
    rows = [
        [
            bucket.entries[i].requests[rank].shapes[j][0]
            if rank in bucket.entries[i].requests
            else 0
            for i, j, _, _ in specs
        ]
        for rank in info.ranks
    ]
    sizes = [row_bytes(shape, dt) for _, _, dt, shape in specs]
    offsets, segment = [], 0
    for r_rows in rows:
        offs, pos = [], 0
        for k, n in enumerate(r_rows):
            offs.append(pos)
            pos = aligned(pos + n * sizes[k])
        offsets.append(offs)
        segment = max(segment, pos)
    return Layout(specs, rows, sizes, offsets, segment)


def run(bucket: Bucket, ops: list[LocalOp | None], info: GroupInfo, device: str) -> None:
    names = [e.name for e in bucket.entries]
    inputs = local_tensors(bucket, ops, device)
    plan = layout(bucket, info)
    me = info.index
    dev = device_of(device) if not inputs or not inputs[0] else inputs[0][0].device
    mine = [inputs[i][j] if plan.rows[me][k] else None for k, (i, j, _, _) in enumerate(plan.specs)]
    begin_each(names, "MEMCPY_IN_FUSION_BUFFER")
    # Equal sizes, one tensor: gather straight into the output.
    direct = (
        len(mine) == 1 and mine[0] is not None and all(r[0] == plan.rows[0][0] for r in plan.rows)
    )
    send = as_bytes(mine[0]) if direct else _pack(mine, plan, me, dev)  # type: ignore[arg-type]
    seg = send.numel()
    recv = torch.empty(seg * info.size, dtype=torch.uint8, device=dev)
    end_each(names, "MEMCPY_IN_FUSION_BUFFER")
    if info.size > 1 and seg:
        gather_work(names, recv, send, info, device)
    elif seg:
        recv.copy_(send)
    begin_each(names, "MEMCPY_OUT_FUSION_BUFFER")
    outputs: list[list[Any]] = [[None] * len(ts) for ts in inputs]
    for k, (i, j, dt, shape) in enumerate(plan.specs):
        flat = recv if direct else _rows_of(recv, plan, k, seg, info.size)
        total_rows = sum(r[k] for r in plan.rows)
        outputs[i][j] = flat.view(dtype_from_name(dt)).reshape((total_rows, *shape[1:]))
    end_each(names, "MEMCPY_OUT_FUSION_BUFFER")
    set_outputs(ops, outputs)


def _pack(
    mine: list[torch.Tensor | None], plan: Layout, me: int, dev: torch.device
) -> torch.Tensor:
    """This rank's segment: its tensors' bytes at their offsets, zeros between."""
    send = torch.zeros(plan.segment, dtype=torch.uint8, device=dev)
    for k, t in enumerate(mine):
        if t is not None and t.numel():
            o = plan.offsets[me][k]
            send[o : o + t.numel() * t.element_size()].copy_(as_bytes(t))
    return send


def _rows_of(recv: torch.Tensor, plan: Layout, k: int, seg: int, size: int) -> torch.Tensor:
    """The k-th tensor's bytes from every rank's segment, concatenated."""
    starts = [r * seg + plan.offsets[r][k] for r in range(size)]
    pieces = [recv[s : s + plan.rows[r][k] * plan.row_bytes[k]] for r, s in enumerate(starts)]
    return torch.cat(pieces)


def _fuses_on(req: Request) -> tuple[object, ...]:
    """Allgathers of one kind, set and device fuse whatever else they hold."""
    return ()


SPEC = OpSpec(
    kind=ALLGATHER,
    run=run,
    fuses_on=_fuses_on,
    per_rank_shapes=True,
    join_refusal="Allgather is not supported with Join at this time. Specify "
    "sparse_as_dense=True if using DistributedOptimizer",
    faces={
        "collectives": ("allgather_async", "grouped_allgather_async"),
        "torch": ("allgather", "grouped_allgather"),
        "tensorflow": ("allgather", "grouped_allgather"),
        "keras": ("allgather",),
    },
)
