"""The data path: run one negotiated bucket with gloo (CPU) or NCCL (CUDA).

Every rank runs the same buckets in the same order, so the backend's order-matched collectives
always meet. A bucket of one tensor is reduced where it lies (no fusion copy); a bucket of many is
packed into one buffer, reduced once, and handed back as views of that buffer.

CPU allreduces of a set whose ranks share one host go through shared memory (`_shm`), gloo's
loopback TCP otherwise.

CUDA tensors go through NCCL when every rank of the set has a GPU of its own; where ranks share a
GPU (NCCL refuses that) or NCCL is missing, they go through gloo by way of host copies, as Horovod
built without NCCL does.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from hora.collectives._common import Average, Max, Min, Product, Sum
from hora.collectives._dtypes import as_bytes, cast_back_, dtype_from_name, reduce_dtype, scale_
from hora.collectives._negotiation import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    BARRIER,
    BROADCAST,
    REDUCESCATTER,
    Bucket,
    Request,
)
from hora.timeline import hooks as _th

_REDUCE_OPS = {
    Average: dist.ReduceOp.SUM,
    Sum: dist.ReduceOp.SUM,
    Min: dist.ReduceOp.MIN,
    Max: dist.ReduceOp.MAX,
    Product: dist.ReduceOp.PRODUCT,
}
_ALIGN = 16  # byte offsets inside a fused buffer, so that every slice can be viewed as its dtype
# Newer torch renamed these two and warns (FutureWarning, on every rank) at each old-name call.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

# Counters the tests read to see fusion at work (never timings).
stats: Counter[str] = Counter()


class FusionBuffer:
    """One persistent CPU buffer per dtype for in-place fused allreduces, and its views per
    bucket layout (the tensors' shapes in order), as Horovod keeps its fusion buffer.

    A fresh buffer per bucket costs page faults, and splitting it into views costs ~1.5 us of
    torch per tensor each way; a training step fuses the same layouts again and again, so the
    views are made once and the copies in and out are one `_foreach_copy_` each. Only in-place
    buckets use it: their results are copied out before the next bucket runs, so nothing of
    the buffer escapes to the caller.
    """

    MAX_LAYOUTS = 64  # layouts remembered; a model with more simply rebuilds the views

    def __init__(self) -> None:
        self._buffers: dict[torch.dtype, torch.Tensor] = {}
        self._layouts: dict[tuple[Any, ...], tuple[torch.Tensor, list[torch.Tensor]]] = {}

    def views(
        self, tensors: list[torch.Tensor], layout: tuple[Any, ...] | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The flat buffer for `tensors` (same dtype, CPU) and views of it shaped like each.
        `layout`: a key that fixes dtype and shapes (the entries' cache ids), cheaper to build
        than the shapes themselves."""
        dtype = tensors[0].dtype
        key = (dtype, layout) if layout is not None else (dtype, *[t.shape for t in tensors])
        hit = self._layouts.get(key)
        if hit is not None:
            return hit
        total = sum(t.numel() for t in tensors)
        buffer = self._buffers.get(dtype)
        if buffer is None or buffer.numel() < total:
            buffer = self._buffers[dtype] = torch.empty(total, dtype=dtype)
            for k in [k for k in self._layouts if k[0] == dtype]:
                del self._layouts[k]  # they view the buffer just replaced
        if len(self._layouts) >= self.MAX_LAYOUTS:
            self._layouts.clear()
        flat = buffer[:total]
        hit = self._layouts[key] = (flat, list(_unflatten_dense_tensors(flat, tensors)))
        return hit


@dataclass
class GroupInfo:
    """A process set as the data path sees it: its ranks and its backend groups."""

    ranks: tuple[int, ...]
    index: int  # this process's position in `ranks`, -1 when not a member
    gloo: Any = None  # a torch ProcessGroup, None when the set has one member
    nccl: Any = None
    nccl_usable: bool | None = None  # decided at the set's first CUDA collective
    local: Any = None  # a _shm.LocalReducer when every member is on this host
    fusion: FusionBuffer = field(default_factory=FusionBuffer)

    @property
    def size(self) -> int:
        return len(self.ranks)


@dataclass(slots=True)  # one per operation: slots make it cheaper to build and read
class LocalOp:
    """What this rank submitted for one entry: its tensors, and whether to write into them."""

    tensors: list[torch.Tensor]
    inplace: bool
    outputs: list[Any] | None = None
    ready: Any = None  # a torch.cuda.Event recorded on the caller's stream at submission


def _begin(names: list[str], phase: str) -> None:
    rec = _th.recorder
    if rec.enabled:
        for name in names:
            rec.begin(name, phase)


def _end(names: list[str], phase: str) -> None:
    rec = _th.recorder
    if rec.enabled:
        for name in names:
            rec.end(name, phase)


def _device(device: str) -> torch.device:
    if device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _zeros_like_request(req: Request, device: str) -> list[torch.Tensor]:
    """A joined rank's contribution: zeros shaped like the others' tensors."""
    dev = _device(device)
    return [
        torch.zeros(shape, dtype=dtype_from_name(dt), device=dev)
        for dt, shape in zip(req.dtypes, req.shapes, strict=True)
    ]


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def run_bucket(bucket: Bucket, ops: list[LocalOp | None], info: GroupInfo) -> None:
    """Run `bucket` on this rank; results land in each op's `outputs`."""
    device = bucket.entries[0].ref.device
    if device != "cuda":
        _run_bucket(bucket, ops, info, device)
        return
    mine = next((op.tensors[0] for op in ops if op is not None and op.tensors), None)
    with torch.cuda.device(mine.device if mine is not None else torch.cuda.current_device()):
        stream = torch.cuda.current_stream()
        for op in ops:
            if op is not None and op.ready is not None:
                stream.wait_event(op.ready)  # the caller's kernels that produced the tensor
        _run_bucket(bucket, ops, info, device)
        stream.synchronize()


def _run_bucket(bucket: Bucket, ops: list[LocalOp | None], info: GroupInfo, device: str) -> None:
    kind = bucket.kind
    stats["buckets"] += 1
    if len(bucket.entries) > 1:
        stats["fused_buckets"] += 1
        stats["fused_entries"] += len(bucket.entries)
    if kind == ALLREDUCE:
        _allreduce(bucket, ops, info, device)
    elif kind == ALLGATHER:
        _allgather(bucket, ops, info, device)
    elif kind == BROADCAST:
        _broadcast(bucket, ops, info, device)
    elif kind == ALLTOALL:
        _alltoall(bucket, ops, info, device)
    elif kind == REDUCESCATTER:
        _reducescatter(bucket, ops, info, device)
    elif kind == BARRIER:
        for op in ops:
            if op is not None:
                op.outputs = []
    else:  # pragma: no cover - the coordinator only sends known kinds
        raise RuntimeError(f"unknown collective {kind}")


def _local_tensors(
    bucket: Bucket, ops: list[LocalOp | None], device: str
) -> list[list[torch.Tensor]]:
    return [
        op.tensors if op is not None else _zeros_like_request(entry.ref, device)
        for entry, op in zip(bucket.entries, ops, strict=True)
    ]


def _nccl_usable(info: GroupInfo) -> bool:
    """Whether NCCL can serve this set: each member on a GPU of its own (asked once, over gloo)."""
    if info.nccl_usable is None:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        mine = str(getattr(props, "uuid", "")) or f"{props.pci_bus_id}:{props.pci_device_id}"
        gpus: list[Any] = [None] * info.size
        dist.all_gather_object(gpus, mine, group=info.gloo)
        info.nccl_usable = len(set(gpus)) == info.size
        if not info.nccl_usable and info.index == 0:
            warnings.warn(
                f"hora.torch: ranks {list(info.ranks)} share GPUs, which NCCL refuses; their CUDA "
                "collectives go through gloo and host memory (slower). Give each rank its own "
                "GPU, e.g. torch.cuda.set_device(hvd.local_rank()), for NCCL.",
                stacklevel=2,
            )
    return info.nccl_usable


def _collective(
    names: list[str],
    kind: str,
    info: GroupInfo,
    device: str,
    fn: Any,
    out: Any,
    *args: Any,
    **kwargs: Any,
) -> None:
    """`fn(out, *args, group=...)` on the set's backend; `out` is the tensor the call writes."""
    staged = device == "cuda" and (info.nccl is None or not _nccl_usable(info))
    phase = f"{'NCCL' if device == 'cuda' and not staged else 'GLOO'}_{kind.upper()}"
    _begin(names, phase)
    if staged:
        host = [a.cpu() if isinstance(a, torch.Tensor) else a for a in (out, *args)]
        fn(*host, group=info.gloo, **kwargs)
        out.copy_(host[0])
    else:
        fn(out, *args, group=info.nccl if device == "cuda" else info.gloo, **kwargs)
    stats[f"{kind}_calls"] += 1
    if device == "cuda":
        stats["cuda_staged_calls" if staged else "cuda_nccl_calls"] += 1
    _end(names, phase)


def _layout(bucket: Bucket) -> tuple[Any, ...] | None:
    """A bucket of response-cache hits only is laid out by its ids: an id stands for one
    request (dtypes and shapes included) and is never reused for another."""
    ids = tuple([e.cached for e in bucket.entries])
    return None if -1 in ids else ids


def _allreduce_in_place(bucket: Bucket, ops: list[LocalOp | None], info: GroupInfo) -> bool:
    """The common bucket (a step's gradients): this rank's CPU tensors, one per entry, of one
    dtype that reduces as itself, all in place. Runs it with none of the general path's
    per-tensor bookkeeping: on one host the tensors go straight into the shared segment and
    the sum lands in the persistent fusion buffer, elsewhere they are packed into that buffer
    for the backend; False: not such a bucket."""
    tensors: list[torch.Tensor] = []
    dtype = None
    for op in ops:
        if op is None or not op.inplace or len(op.tensors) != 1:
            return False
        t = op.tensors[0]
        if t.dtype is not dtype:
            if dtype is not None:
                return False
            dtype = t.dtype
        tensors.append(t)
    if dtype is None or reduce_dtype(dtype, "cpu") != dtype:
        return False
    ref = bucket.entries[0].ref
    timed = _th.recorder.enabled
    names = [e.name for e in bucket.entries] if timed else []
    _begin(names, "MEMCPY_IN_FUSION_BUFFER")
    layout = _layout(bucket) or (dtype, *[t.shape for t in tensors])  # worked out once
    work, views = info.fusion.views(tensors, layout)
    local = info.local if info.size > 1 else None
    if local is not None and ref.prescale == 1.0 and local.fits(work.nbytes):
        _end(names, "MEMCPY_IN_FUSION_BUFFER")  # into the shared segment, in the reduction
        _begin(names, "SHM_ALLREDUCE")
        local.allreduce_from_(tensors, layout, work, ref.op)
        stats["allreduce_calls"] += 1
        stats["shm_allreduce_calls"] += 1
        _end(names, "SHM_ALLREDUCE")
    else:
        torch._foreach_copy_(views, tensors)
        scale_(work, ref.prescale)
        _end(names, "MEMCPY_IN_FUSION_BUFFER")
        _reduce_work(names, work, ref.op, info, "cpu")
    scale_(work, ref.postscale / info.size if ref.op == Average else ref.postscale)
    _begin(names, "MEMCPY_OUT_FUSION_BUFFER")
    torch._foreach_copy_(tensors, views)
    for op in ops:
        op.outputs = op.tensors  # type: ignore[union-attr]
    _end(names, "MEMCPY_OUT_FUSION_BUFFER")
    return True


def _reduce_work(
    names: list[str], work: torch.Tensor, op: int, info: GroupInfo, device: str
) -> None:
    """Reduce one packed buffer across the set: shared memory on one host, else the backend."""
    if info.size > 1 and device == "cpu" and info.local is not None:
        _begin(names, "SHM_ALLREDUCE")
        info.local.allreduce_(work, op)
        stats["allreduce_calls"] += 1
        stats["shm_allreduce_calls"] += 1
        _end(names, "SHM_ALLREDUCE")
    elif info.size > 1:
        _collective(names, ALLREDUCE, info, device, dist.all_reduce, work, op=_REDUCE_OPS[op])


def _allreduce(bucket: Bucket, ops: list[LocalOp | None], info: GroupInfo, device: str) -> None:
    if device == "cpu" and len(ops) > 1 and _allreduce_in_place(bucket, ops, info):
        return
    ref = bucket.entries[0].ref
    names = [e.name for e in bucket.entries]
    inputs = _local_tensors(bucket, ops, device)
    outputs: list[list[Any]] = [[None] * len(ts) for ts in inputs]
    by_dtype: dict[torch.dtype, list[tuple[int, int, torch.Tensor]]] = {}
    for i, ts in enumerate(inputs):
        for j, t in enumerate(ts):
            by_dtype.setdefault(t.dtype, []).append((i, j, t))
    post = ref.postscale / info.size if ref.op == Average else ref.postscale
    for dtype, items in by_dtype.items():
        wide = reduce_dtype(dtype, device)
        inplace_single = (
            len(items) == 1 and ops[items[0][0]] is not None and ops[items[0][0]].inplace
        )  # type: ignore[union-attr]
        _begin(names, "MEMCPY_IN_FUSION_BUFFER")
        persistent = (
            len(items) > 1
            and wide == dtype
            and device == "cpu"
            and all(ops[i] is not None and ops[i].inplace for i, _, _ in items)  # type: ignore[union-attr]
        )
        if persistent:
            tensors = [t for _, _, t in items]
            work, views = info.fusion.views(tensors)
            torch._foreach_copy_(views, tensors)
        elif len(items) == 1:
            t = items[0][2]
            if wide != dtype:
                work = t.to(wide)
            elif inplace_single:
                work = t
            else:
                work = t.clone()
        elif wide == dtype:
            work = _flatten_dense_tensors([t for _, _, t in items])  # one C++ loop
        else:
            work = torch.empty(sum(t.numel() for _, _, t in items), dtype=wide, device=t.device)
            offset = 0
            for _, _, t in items:
                work[offset : offset + t.numel()].copy_(t.reshape(-1))
                offset += t.numel()
        scale_(work, ref.prescale)
        _end(names, "MEMCPY_IN_FUSION_BUFFER")
        _reduce_work(names, work, ref.op, info, device)
        scale_(work, post)
        _begin(names, "MEMCPY_OUT_FUSION_BUFFER")
        if persistent:
            torch._foreach_copy_(tensors, views)
            for i, j, t in items:
                outputs[i][j] = t
            _end(names, "MEMCPY_OUT_FUSION_BUFFER")
            continue
        if len(items) > 1 and wide == dtype:
            _unfuse(work, items, ops, outputs)
            _end(names, "MEMCPY_OUT_FUSION_BUFFER")
            continue
        offset = 0
        for i, j, t in items:
            piece = work if len(items) == 1 else work[offset : offset + t.numel()].view(t.shape)
            offset += t.numel()
            op = ops[i]
            if op is not None and op.inplace:
                if piece is not t:
                    cast_back_(t, piece)
                outputs[i][j] = t
            elif wide != dtype:
                out = torch.empty_like(t)
                cast_back_(out, piece)
                outputs[i][j] = out
            else:
                outputs[i][j] = piece
        _end(names, "MEMCPY_OUT_FUSION_BUFFER")
    for op, outs in zip(ops, outputs, strict=True):
        if op is not None:
            op.outputs = outs


def _unfuse(
    work: torch.Tensor,
    items: list[tuple[int, int, torch.Tensor]],
    ops: list[LocalOp | None],
    outputs: list[list[Any]],
) -> None:
    """Hand a fused buffer back as views shaped like the inputs (made in one C++ loop); in-place
    entries get one `_foreach_copy_` (C++ too): ~1 us of Python per tensor saved twice."""
    tensors = [t for _, _, t in items]
    pieces = _unflatten_dense_tensors(work, tensors)
    if all(ops[i] is not None and ops[i].inplace for i, _, _ in items):  # type: ignore[union-attr]
        torch._foreach_copy_(tensors, pieces)
        for i, j, t in items:
            outputs[i][j] = t
        return
    for (i, j, t), piece in zip(items, pieces, strict=True):
        op = ops[i]
        if op is not None and op.inplace:
            t.copy_(piece)
            outputs[i][j] = t
        else:
            outputs[i][j] = piece


def _row_bytes(shape: tuple[int, ...], dtype: str) -> int:
    return math.prod(shape[1:]) * dtype_from_name(dtype).itemsize


def _allgather(bucket: Bucket, ops: list[LocalOp | None], info: GroupInfo, device: str) -> None:
    names = [e.name for e in bucket.entries]
    inputs = _local_tensors(bucket, ops, device)
    # rows[r][k]: rows rank r contributes to the k-th tensor of the bucket (0 when joined).
    specs: list[tuple[int, int, str, tuple[int, ...]]] = []  # (entry, tensor, dtype, ref shape)
    for i, entry in enumerate(bucket.entries):
        for j, (dt, shape) in enumerate(zip(entry.ref.dtypes, entry.ref.shapes, strict=True)):
            specs.append((i, j, dt, shape))
    rows = [
        [
            bucket.entries[i].requests[rank].shapes[j][0]
            if rank in bucket.entries[i].requests
            else 0
            for i, j, _, _ in specs
        ]
        for rank in info.ranks
    ]
    row_bytes = [_row_bytes(shape, dt) for _, _, dt, shape in specs]
    me = info.index
    dev = _device(device) if not inputs or not inputs[0] else inputs[0][0].device
    mine = [inputs[i][j] if rows[me][k] else None for k, (i, j, _, _) in enumerate(specs)]
    # Each rank's segment: its tensors' bytes, each aligned, padded to the longest segment.
    seg_offsets = []
    for r_rows in rows:
        offs, pos = [], 0
        for k, n in enumerate(r_rows):
            offs.append(pos)
            pos = _aligned(pos + n * row_bytes[k])
        seg_offsets.append((offs, pos))
    seg = max(total for _, total in seg_offsets)
    _begin(names, "MEMCPY_IN_FUSION_BUFFER")
    direct = len(specs) == 1 and mine[0] is not None and all(r[0] == rows[0][0] for r in rows)
    if direct:
        send = as_bytes(mine[0])  # type: ignore[arg-type]  # equal sizes, one tensor: gather straight into the output
        seg = send.numel()
    else:
        send = torch.zeros(seg, dtype=torch.uint8, device=dev)
        for k, t in enumerate(mine):
            if t is not None and t.numel():
                o = seg_offsets[me][0][k]
                send[o : o + t.numel() * t.element_size()].copy_(as_bytes(t))
    recv = torch.empty(seg * info.size, dtype=torch.uint8, device=dev)
    _end(names, "MEMCPY_IN_FUSION_BUFFER")
    if info.size > 1 and seg:
        _collective(names, ALLGATHER, info, device, _all_gather_single, recv, send)
    elif seg:
        recv.copy_(send)
    _begin(names, "MEMCPY_OUT_FUSION_BUFFER")
    outputs: list[list[Any]] = [[None] * len(ts) for ts in inputs]
    for k, (i, j, dt, shape) in enumerate(specs):
        dtype = dtype_from_name(dt)
        total_rows = sum(r[k] for r in rows)
        if direct:
            flat = recv
        else:
            starts = [r * seg + seg_offsets[r][0][k] for r in range(info.size)]
            pieces = [recv[s : s + rows[r][k] * row_bytes[k]] for r, s in enumerate(starts)]
            flat = torch.cat(pieces)
        outputs[i][j] = flat.view(dtype).reshape((total_rows, *shape[1:]))
    _end(names, "MEMCPY_OUT_FUSION_BUFFER")
    for op, outs in zip(ops, outputs, strict=True):
        if op is not None:
            op.outputs = outs


def _broadcast(bucket: Bucket, ops: list[LocalOp | None], info: GroupInfo, device: str) -> None:
    names = [e.name for e in bucket.entries]
    root = bucket.entries[0].ref.root
    is_root = info.ranks[info.index] == root
    inputs = _local_tensors(bucket, ops, device)
    flat = [(i, j, t) for i, ts in enumerate(inputs) for j, t in enumerate(ts)]
    outputs: list[list[Any]] = [[None] * len(ts) for ts in inputs]

    def target(i: int, t: torch.Tensor) -> torch.Tensor:
        op = ops[i]
        if op is not None and op.inplace:
            return t
        return t.clone() if is_root else torch.empty_like(t)

    if len(flat) == 1:
        i, j, t = flat[0]
        out = target(i, t)
        if info.size > 1 and out.numel():
            _collective(names, BROADCAST, info, device, dist.broadcast, as_bytes(out), src=root)
        outputs[i][j] = out
    else:
        offsets, pos = [], 0
        for _, _, t in flat:
            offsets.append(pos)
            pos = _aligned(pos + t.numel() * t.element_size())
        dev = flat[0][2].device
        _begin(names, "MEMCPY_IN_FUSION_BUFFER")
        buf = torch.empty(pos, dtype=torch.uint8, device=dev)
        if is_root:
            for (_, _, t), o in zip(flat, offsets, strict=True):
                buf[o : o + t.numel() * t.element_size()].copy_(as_bytes(t))
        _end(names, "MEMCPY_IN_FUSION_BUFFER")
        if info.size > 1:
            _collective(names, BROADCAST, info, device, dist.broadcast, buf, src=root)
        _begin(names, "MEMCPY_OUT_FUSION_BUFFER")
        for (i, j, t), o in zip(flat, offsets, strict=True):
            piece = buf[o : o + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            op = ops[i]
            if op is not None and op.inplace:
                if not is_root:
                    t.copy_(piece)
                outputs[i][j] = t
            else:
                outputs[i][j] = t.clone() if is_root else piece
        _end(names, "MEMCPY_OUT_FUSION_BUFFER")
    for op, outs in zip(ops, outputs, strict=True):
        if op is not None:
            op.outputs = outs


def _alltoall(bucket: Bucket, ops: list[LocalOp | None], info: GroupInfo, device: str) -> None:
    (entry,) = bucket.entries
    (op,) = ops
    assert op is not None  # the coordinator refuses alltoall with joined ranks
    names = [entry.name]
    me = info.ranks[info.index]
    outs: list[Any] = []
    for j, t in enumerate(op.tensors):
        send_splits = list(entry.requests[me].splits[j])  # type: ignore[index]
        recv_splits = [entry.requests[r].splits[j][info.index] for r in info.ranks]  # type: ignore[index]
        rb = _row_bytes(tuple(t.shape), str(t.dtype).removeprefix("torch."))
        sent = t.narrow(0, 0, sum(send_splits)) if t.dim() else t
        src = sent.reshape(-1).view(torch.uint8).view(sum(send_splits), rb) if rb else None
        out_bytes = torch.empty((sum(recv_splits), rb), dtype=torch.uint8, device=t.device)
        if info.size > 1 and src is not None:
            _collective(
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


def _reducescatter(bucket: Bucket, ops: list[LocalOp | None], info: GroupInfo, device: str) -> None:
    (entry,) = bucket.entries
    ref = entry.ref
    names = [entry.name]
    (op,) = ops
    inputs = op.tensors if op is not None else _zeros_like_request(ref, device)
    n = info.size
    post = ref.postscale / n if ref.op == Average else ref.postscale
    outs: list[Any] = []
    for t in inputs:
        dtype = t.dtype
        wide = reduce_dtype(dtype, device)
        dim0 = t.shape[0]
        base, extra = divmod(dim0, n)
        counts = [base + (1 if r < extra else 0) for r in range(n)]
        starts = [sum(counts[:r]) for r in range(n)]
        me = info.index
        work = t.to(wide) if wide != dtype else t.clone()
        scale_(work, ref.prescale)
        if info.size > 1:
            chunk = base + (1 if extra else 0)
            if extra:
                padded = torch.zeros((chunk * n, *t.shape[1:]), dtype=wide, device=t.device)
                for r in range(n):
                    padded[r * chunk : r * chunk + counts[r]].copy_(
                        work[starts[r] : starts[r] + counts[r]]
                    )
                work = padded
            out = torch.empty((chunk, *t.shape[1:]), dtype=wide, device=t.device)
            _collective(
                names,
                REDUCESCATTER,
                info,
                device,
                _reduce_scatter_single,
                out,
                work,
                op=_REDUCE_OPS[ref.op],
            )
            out = out[: counts[me]]
        else:
            out = work
        scale_(out, post)
        if wide != dtype:
            result = torch.empty(out.shape, dtype=dtype, device=t.device)
            cast_back_(result, out)
            out = result
        outs.append(out)
    if op is not None:
        op.outputs = outs
