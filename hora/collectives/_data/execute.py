"""The data path: run one negotiated bucket with its kind's algorithm (the op's `SPEC.run`, found
by `registry`).

Every rank runs the same buckets in the same order, so the transport's order-matched collectives
always meet. A CUDA bucket runs on the device of this rank's tensors, after the kernels that
produced them (each op's `ready` event) and before its results are handed back (the stream is
synchronized).
"""

from __future__ import annotations

import torch

from hora.collectives._data.groups import GroupInfo
from hora.collectives._data.local_op import LocalOp
from hora.collectives._data.registry import OPS
from hora.collectives._data.transports import stats
from hora.collectives._messages import Bucket

_ALGORITHMS = {kind: spec.run for kind, spec in OPS.items()}


def run_bucket(bucket: Bucket, ops: list[LocalOp | None], info: GroupInfo) -> None:
    """Run `bucket` on this rank; results land in each op's `outputs`."""
    device = bucket.entries[0].ref.device
    if device != "cuda":
        _run(bucket, ops, info, device)
        return
    mine = next((op.tensors[0] for op in ops if op is not None and op.tensors), None)
    with torch.cuda.device(mine.device if mine is not None else torch.cuda.current_device()):
        stream = torch.cuda.current_stream()
        for op in ops:
            if op is not None and op.ready is not None:
                stream.wait_event(op.ready)  # the caller's kernels that produced the tensor
        _run(bucket, ops, info, device)
        stream.synchronize()


def _run(bucket: Bucket, ops: list[LocalOp | None], info: GroupInfo, device: str) -> None:
    algorithm = _ALGORITHMS.get(bucket.kind)
    if algorithm is None:  # pragma: no cover - the coordinator only sends known kinds
        raise RuntimeError(f"unknown collective {bucket.kind}")
    stats["buckets"] += 1
    if len(bucket.entries) > 1:
        stats["fused_buckets"] += 1
        stats["fused_entries"] += len(bucket.entries)
    algorithm(bucket, ops, info, device)
