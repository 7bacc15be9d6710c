"""Alltoall: rows `splits[i]` of this rank's tensor go to rank i of the set, and it receives the
rows every rank sends it, in rank order. Always alone in its bucket (splits differ per rank), and
refused while a rank has joined, so every op is this rank's own."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hora.collectives._data.algorithms import row_bytes
from hora.collectives._data.groups import GroupInfo
from hora.collectives._data.local_op import LocalOp
from hora.collectives._data.op_spec import OpSpec
from hora.collectives._data.transports import collective
from hora.collectives._messages import ALLTOALL, Bucket


def run(bucket: Bucket, ops: list[LocalOp | None], info: GroupInfo, device: str) -> None:
    (entry,) = bucket.entries
    (op,) = ops
    assert op is not None  # the coordinator refuses alltoall with joined ranks
    names = [entry.name]
    me = info.ranks[info.index]
    outs: list[Any] = []
    for j, t in enumerate(op.tensors):
        send_splits = list(entry.requests[me].splits[j])  # type: ignore[index]
        recv_splits = [entry.requests[r].splits[j][info.index] for r in info.ranks]  # type: ignore[index]
        rb = row_bytes(tuple(t.shape), str(t.dtype).removeprefix("torch."))
        sent = t.narrow(0, 0, sum(send_splits)) if t.dim() else t
        src = sent.reshape(-1).view(torch.uint8).view(sum(send_splits), rb) if rb else None
        out_bytes = torch.empty((sum(recv_splits), rb), dtype=torch.uint8, device=t.device)
        if info.size > 1 and src is not None:
            collective(
                names,
                ALLTOALL,
                info,
                device,
                dist.all_to_all_single,
                out_bytes,
                src,
                recv_splits,
                send_splits,
            )
        elif src is not None:
            out_bytes.copy_(src)
        rows = (sum(recv_splits), *t.shape[1:])
        # Rows of zero bytes (a [n, 0] tensor) have no bytes to view as another dtype.
        output = out_bytes.view(t.dtype).reshape(rows) if rb else t.new_empty(rows)
        outs.append((output, torch.tensor(recv_splits, dtype=torch.int32)))
    op.outputs = outs


SPEC = OpSpec(
    kind=ALLTOALL,
    run=run,
    per_rank_shapes=True,
    join_refusal="Alltoall is not supported with Join at this time.",
    faces={
        "collectives": ("alltoall_async",),
        "torch": ("alltoall",),
        "tensorflow": ("alltoall",),
    },
)
