"""The transports a bucket's data moves through (gloo, NCCL, shared memory, the hierarchical
path), and which one serves a call.

CPU allreduces of a set whose ranks share one host go through shared memory (`shm`); those of
the global set of a job on several hosts, and its allgathers and broadcasts, through the
hierarchical path (`hierarchy`: shared memory within each host, gloo across), where it is set
up; gloo's TCP otherwise. CUDA tensors go through NCCL when every rank of the set has a GPU of its
own; where ranks share a GPU (NCCL refuses that) or NCCL is missing, they go through gloo by way
of host copies ("staged"), as Horovod built without NCCL does.
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Any

import torch
import torch.distributed as dist

from hora.collectives._common import Average, Max, Min, Product, Sum
from hora.collectives._data.dtypes import scale_
from hora.collectives._data.groups import GroupInfo
from hora.collectives._messages import ALLGATHER, ALLREDUCE, BROADCAST
from hora.timeline.hooks import begin_each, end_each

REDUCE_OPS = {
    Average: dist.ReduceOp.SUM,
    Sum: dist.ReduceOp.SUM,
    Min: dist.ReduceOp.MIN,
    Max: dist.ReduceOp.MAX,
    Product: dist.ReduceOp.PRODUCT,
}
# Newer torch renamed it and warns (FutureWarning, on every rank) at each old-name call.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

# Counters the tests read to see fusion and routing at work (never timings).
stats: Counter[str] = Counter()


def nccl_usable(info: GroupInfo) -> bool:
    """Whether NCCL can serve this set: each member on a GPU of its own (asked once, over gloo)."""
    if info.nccl_usable is None:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        mine = str(getattr(props, "uuid", ""))
        if not mine:  # the PCI fields are in the CUDA properties, missing from torch's stub
            mine = f"{props.pci_bus_id}:{props.pci_device_id}"  # type: ignore[attr-defined]
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


def collective(
    names: list[str],
    kind: str,
    info: GroupInfo,
    device: str,
    fn: Any,
    out: Any,
    *args: Any,
    **kwargs: Any,
) -> None:
    """`fn(out, *args, group=...)` on the set's gloo or NCCL group; `out`: what the call writes."""
    staged = device == "cuda" and (info.nccl is None or not nccl_usable(info))
    phase = f"{'NCCL' if device == 'cuda' and not staged else 'GLOO'}_{kind.upper()}"
    begin_each(names, phase)
    if staged:
        host = [a.cpu() if isinstance(a, torch.Tensor) else a for a in (out, *args)]
        fn(*host, group=info.gloo, **kwargs)
        out.copy_(host[0])
    else:
        fn(out, *args, group=info.nccl if device == "cuda" else info.gloo, **kwargs)
    stats[f"{kind}_calls"] += 1
    if device == "cuda":
        stats["cuda_staged_calls" if staged else "cuda_nccl_calls"] += 1
    end_each(names, phase)


def shm_allreduce(names: list[str], run: Any, *args: Any) -> None:
    """`run(*args)`, a shared-memory reduction (`shm.LocalReducer`), timed and counted."""
    begin_each(names, "SHM_ALLREDUCE")
    run(*args)
    stats["allreduce_calls"] += 1
    stats["shm_allreduce_calls"] += 1
    end_each(names, "SHM_ALLREDUCE")


def hierarchical(names: list[str], kind: str, run: Any, *args: Any) -> None:
    """`run(*args)`, an operation of the hierarchical path (`hierarchy.Hierarchy`), timed and
    counted (an allreduce's reduction within the host is a shared-memory one)."""
    phase = f"HIERARCHICAL_{kind.upper()}"
    begin_each(names, phase)
    run(*args)
    stats[f"{kind}_calls"] += 1
    stats[f"hierarchical_{kind}_calls"] += 1
    if kind == ALLREDUCE:
        stats["shm_allreduce_calls"] += 1
    end_each(names, phase)


def reads_source(info: GroupInfo, device: str) -> bool:
    """Whether `reduce_work` takes its input apart from its output (`src`): shared memory
    reads it where it lies."""
    hierarchy = info.hierarchy
    return (
        info.size > 1
        and device == "cpu"
        and (info.local is not None or (hierarchy is not None and hierarchy.allreduce_on))
    )


def reduce_work(
    names: list[str],
    work: torch.Tensor,
    op: int,
    info: GroupInfo,
    device: str,
    scale: float = 1.0,
    src: torch.Tensor | None = None,
) -> None:
    """Reduce one packed buffer across the set, then scale it: shared memory on one host, the
    hierarchical path on several, else gloo or NCCL. `src`, where `reads_source`: the input,
    when `work` is a fresh output."""
    if info.size > 1 and device == "cpu":
        source = work if src is None else src
        if info.local is not None:
            shm_allreduce(names, info.local.allreduce, source, work, op, scale)
            return
        hierarchy = info.hierarchy
        if hierarchy is not None and hierarchy.allreduce_on:
            hierarchical(names, ALLREDUCE, hierarchy.allreduce, source, work, op, scale)
            return
    assert src is None, "only shared memory reduces into a separate output"
    if info.size > 1:
        collective(names, ALLREDUCE, info, device, dist.all_reduce, work, op=REDUCE_OPS[op])
    scale_(work, scale)


def gather_work(
    names: list[str], recv: torch.Tensor, send: torch.Tensor, info: GroupInfo, device: str
) -> None:
    """`recv` = every member's `send` (bytes, equal counts), in set order: the hierarchical path
    where it serves, else gloo or NCCL."""
    hierarchy = info.hierarchy
    if device == "cpu" and hierarchy is not None and hierarchy.allgather_on:
        hierarchical(names, ALLGATHER, hierarchy.allgather, recv, send)
    else:
        collective(names, ALLGATHER, info, device, all_gather_single, recv, send)


def broadcast_work(
    names: list[str], buf: torch.Tensor, root: int, info: GroupInfo, device: str
) -> None:
    """`buf` (bytes) = global rank `root`'s: the hierarchical path where it serves, else the
    gloo or NCCL."""
    hierarchy = info.hierarchy
    if device == "cpu" and hierarchy is not None and hierarchy.allgather_on:
        hierarchical(names, BROADCAST, hierarchy.broadcast, buf, root)
    else:
        collective(names, BROADCAST, info, device, dist.broadcast, buf, src=root)
