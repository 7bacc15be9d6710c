"""Horovod's collectives, framework-neutral: the async, in-place and grouped forms.

Every call builds a request (name, shapes, dtypes, op) and hands it to the background engine,
which negotiates it by name with the other ranks; the sync forms are `synchronize(*_async(...))`.
The requests themselves, every argument explicit, are `framework`'s `submit_*`; the
differentiable forms are the frameworks' (hora.torch._autograd, hora.tensorflow).
"""

from __future__ import annotations

from typing import Any

import torch

from hora.collectives._common import (
    Adasum,
    Average,
    HorovodInternalError,
    Max,
    Min,
    Product,
    Sum,
)
from hora.collectives._control import sparse as _sparse
from hora.collectives._control import state as _state
from hora.collectives._control.process_sets import ProcessSet, global_process_set
from hora.collectives._control.requests import Tensors, first, submit
from hora.collectives._control.sparse import SparseHandle
from hora.collectives._control.submissions import Op
from hora.collectives._data.local_op import LocalOp
from hora.collectives._messages import BARRIER
from hora.collectives.framework import (
    resolve_op,
    submit_allgather,
    submit_allreduce,
    submit_alltoall,
    submit_broadcast,
    submit_reducescatter,
)


def _none(outputs: list[Any]) -> None:
    return None


# ----- allreduce -------------------------------------------------------------------------------
def allreduce_async(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start an out-of-place allreduce; `synchronize(handle)` returns the reduced tensor."""
    op = resolve_op(average, op)
    return submit_allreduce(
        [tensor], name, op, prescale_factor, postscale_factor, process_set, False, False
    )


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start an in-place allreduce: `tensor` holds the result once the handle completes."""
    op = resolve_op(average, op)
    return submit_allreduce(
        [tensor], name, op, prescale_factor, postscale_factor, process_set, True, False
    )


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Reduce `tensor` in place and return it (the same object)."""
    op = resolve_op(average, op)  # here, so a deprecation warning names the caller's line
    return synchronize(
        allreduce_async_(tensor, None, name, op, prescale_factor, postscale_factor, process_set)
    )


def grouped_allreduce_async(
    tensors: Tensors,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start one fused allreduce of a list; the handle yields a list of tensors."""
    op = resolve_op(average, op)
    return submit_allreduce(
        list(tensors), name, op, prescale_factor, postscale_factor, process_set, False, True
    )


def grouped_allreduce_async_(
    tensors: Tensors,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """In-place form of `grouped_allreduce_async`."""
    op = resolve_op(average, op)
    return submit_allreduce(
        list(tensors), name, op, prescale_factor, postscale_factor, process_set, True, True
    )


def grouped_allreduce_(
    tensors: Tensors,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Reduce a list in place; returns the same tensor objects."""
    op = resolve_op(average, op)  # here, so a deprecation warning names the caller's line
    return synchronize(
        grouped_allreduce_async_(
            tensors, None, name, op, prescale_factor, postscale_factor, process_set
        )
    )


# ----- allgather -------------------------------------------------------------------------------
def allgather_async(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> int:
    """Start an allgather (concatenation on dim 0; dim 0 may differ between ranks)."""
    return submit_allgather([tensor], name, process_set, False)


def grouped_allgather_async(
    tensors: Tensors, name: str | None = None, process_set: ProcessSet = global_process_set
) -> int:
    return submit_allgather(list(tensors), name, process_set, True)


# ----- sparse allreduce ------------------------------------------------------------------------
def sparse_allreduce_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
) -> SparseHandle:
    """Start reducing a sparse COO tensor as Horovod does: an allgather of its indices and one
    of its values (only the non-zero rows travel). Average and Sum only."""
    return _sparse.sparse_allreduce_async(tensor, name, op, process_set)


# ----- broadcast -------------------------------------------------------------------------------
def broadcast_async(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start an out-of-place broadcast from global rank `root_rank`; the source stays untouched."""
    return submit_broadcast(tensor, root_rank, name, process_set, False)


def broadcast_async_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start an in-place broadcast: `tensor` receives the root's values."""
    return submit_broadcast(tensor, root_rank, name, process_set, True)


def broadcast_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Broadcast in place and return `tensor`."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ----- alltoall --------------------------------------------------------------------------------
def alltoall_async(
    tensor: torch.Tensor,
    splits: torch.Tensor | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start an alltoall: rows `splits[i]` go to rank i of the set (even split when None)."""
    return submit_alltoall(tensor, splits, name, process_set, splits is not None)


# ----- reducescatter ---------------------------------------------------------------------------
def reducescatter_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: int = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start a reducescatter: reduce, then rank i keeps the i-th block of rows."""
    return submit_reducescatter(
        [tensor], name, op, prescale_factor, postscale_factor, process_set, False
    )


def grouped_reducescatter_async(
    tensors: Tensors,
    name: str | None = None,
    op: int = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    return submit_reducescatter(
        list(tensors), name, op, prescale_factor, postscale_factor, process_set, True
    )


# ----- synchronisation -------------------------------------------------------------------------
def poll(handle: int | SparseHandle) -> bool:
    """True once the operation behind `handle` has finished (never blocks)."""
    if type(handle) is SparseHandle:
        return handle.poll()
    return _state.get().loop.poll(handle)  # type: ignore[arg-type]


def synchronize(handle: int | SparseHandle) -> Any:
    """Wait for `handle` and return its output; raises HorovodInternalError if it failed."""
    if type(handle) is SparseHandle:
        return handle()
    return _state.get().loop.synchronize(handle)  # type: ignore[arg-type]


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return once every rank of the set has called barrier."""
    synchronize(submit(BARRIER, [], None, process_set, inplace=False, finish=_none))


def join(device: int = -1) -> int:
    """Wait until every rank has joined; until then this rank contributes zeros to the others'
    allreduces and reducescatters, while their allgathers, broadcasts and alltoalls raise
    HorovodInternalError (as in Horovod). Returns the last rank to join."""
    state = _state.get()
    if device >= 0 and torch.cuda.is_available():
        torch.cuda.set_device(device)
    op = Op(None, LocalOp([], False), first)
    return int(synchronize(state.loop.submit(op)))


__all__ = [
    "Adasum",
    "Average",
    "HorovodInternalError",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "allgather_async",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall_async",
    "barrier",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "global_process_set",
    "grouped_allgather_async",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter_async",
    "join",
    "poll",
    "reducescatter_async",
    "sparse_allreduce_async",
    "synchronize",
]
