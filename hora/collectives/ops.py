"""Each collective op's face, framework-neutral: its request with every argument explicit
(`submit_*`, which the frameworks build their differentiable forms on: hora.torch._autograd,
hora.tensorflow) and Horovod's async, in-place and grouped forms, made by `_forms` from one
request per op under the names its spec lists.

Every call builds a request (name, shapes, dtypes, op) and hands it to the collective loop, which
negotiates it by name with the other ranks; the sync forms are `synchronize(*_async(...))`. The
names each op shows are its spec's (`OpSpec.faces`), from which `__all__` is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
from hora.collectives._control.requests import Tensors, first, group_of, submit
from hora.collectives._control.sparse import SparseHandle
from hora.collectives._control.submissions import Op
from hora.collectives._data.local_op import LocalOp
from hora.collectives._forms import (
    Form,
    grouped_handle_form,
    grouped_in_place_form,
    handle_form,
    in_place_form,
)
from hora.collectives._messages import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    BARRIER,
    BROADCAST,
    REDUCESCATTER,
)
from hora.collectives.framework import op_faces, resolve_op


def _none(outputs: list[Any]) -> None:
    return None


# ----- allreduce -------------------------------------------------------------------------------
def submit_allreduce(
    tensors: Tensors,
    name: str | None,
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
    inplace: bool,
    grouped: bool,
    flush: bool = False,
) -> int:
    """Start an allreduce of `tensors` (one fused request when `grouped`, whose handle yields a
    list); `flush`: negotiate it now rather than wait for the cycle (the optimizer's last
    bucket)."""
    return submit(
        ALLREDUCE,
        tensors,
        name,
        process_set,
        inplace=inplace,
        finish=list if grouped else first,
        grouped=grouped,
        op=op,
        prescale=float(prescale_factor),
        postscale=float(postscale_factor),
        flush=flush,
    )


def _allreduce(
    form: Form,
    tensors: Tensors,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Horovod's allreduce forms; `average=` is the deprecated spelling of `op=`."""
    op = resolve_op(average, op, stacklevel=5)  # the caller of the form, past `_forms`
    return submit_allreduce(
        tensors,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
        form.inplace,
        form.grouped,
    )


allreduce_async = handle_form(
    _allreduce,
    "allreduce_async",
    "Start an out-of-place allreduce; `synchronize(handle)` returns the reduced tensor.",
)
allreduce_async_ = handle_form(
    _allreduce,
    "allreduce_async_",
    "Start an in-place allreduce: `tensor` holds the result once the handle completes.",
)
allreduce_ = in_place_form(
    _allreduce, "allreduce_", "Reduce `tensor` in place and return it (the same object)."
)
grouped_allreduce_async = grouped_handle_form(
    _allreduce,
    "grouped_allreduce_async",
    "Start one fused allreduce of a list; the handle yields a list of tensors.",
)
grouped_allreduce_async_ = grouped_handle_form(
    _allreduce, "grouped_allreduce_async_", "In-place form of `grouped_allreduce_async`."
)
grouped_allreduce_ = grouped_in_place_form(
    _allreduce, "grouped_allreduce_", "Reduce a list in place; returns the same tensor objects."
)


# ----- allgather -------------------------------------------------------------------------------
def submit_allgather(
    tensors: Tensors, name: str | None, process_set: ProcessSet, grouped: bool
) -> int:
    """Start an allgather of `tensors` (a list out when `grouped`)."""
    _need_dimensions(tensors, "allgather")
    return submit(
        ALLGATHER,
        tensors,
        name,
        process_set,
        inplace=False,
        finish=list if grouped else first,
        grouped=grouped,
    )


def _need_dimensions(tensors: Tensors, what: str) -> None:
    """Scalars have no first dimension to gather or scatter along."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dim() == 0:
            raise ValueError(f"{what} needs tensors of at least one dimension")


def _allgather(
    form: Form,
    tensors: Tensors,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    return submit_allgather(tensors, name, process_set, form.grouped)


allgather_async = handle_form(
    _allgather,
    "allgather_async",
    "Start an allgather (concatenation on dim 0; dim 0 may differ between ranks).",
)
grouped_allgather_async = grouped_handle_form(_allgather, "grouped_allgather_async", None)


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
def submit_broadcast(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None,
    process_set: ProcessSet,
    inplace: bool,
) -> int:
    """Start a broadcast from global rank `root_rank`, into `tensor` itself when `inplace`."""
    root = int(root_rank)
    state = _state.get()
    if not 0 <= root < state.size:
        raise ValueError(f"root_rank {root} is not a rank of a world of {state.size}")
    return submit(BROADCAST, [tensor], name, process_set, inplace=inplace, finish=first, root=root)


def _broadcast(
    form: Form,
    tensors: Tensors,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    (tensor,) = tensors
    return submit_broadcast(tensor, root_rank, name, process_set, form.inplace)


broadcast_async = handle_form(
    _broadcast,
    "broadcast_async",
    "Start an out-of-place broadcast from global rank `root_rank`; the source stays untouched.",
)
broadcast_async_ = handle_form(
    _broadcast,
    "broadcast_async_",
    "Start an in-place broadcast: `tensor` receives the root's values.",
)
broadcast_ = in_place_form(_broadcast, "broadcast_", "Broadcast in place and return `tensor`.")


# ----- alltoall --------------------------------------------------------------------------------
def submit_alltoall(
    tensor: torch.Tensor,
    splits: torch.Tensor | None,
    name: str | None,
    process_set: ProcessSet,
    with_received: bool,
) -> int:
    """Start an alltoall; its handle yields `(output, received_splits)` when `with_received`."""
    _, info = group_of(process_set)
    values = _alltoall_splits(tensor, splits, info.size)
    return submit(
        ALLTOALL,
        [tensor],
        name,
        process_set,
        inplace=False,
        finish=first if with_received else _first_of_first,
        splits=(values,),
    )


def _alltoall_splits(tensor: torch.Tensor, splits: Any, n: int) -> tuple[int, ...]:
    """The rows of `tensor` each of the `n` ranks gets (`splits`, or an even split), checked."""
    if tensor.dim() == 0:
        raise ValueError("alltoall needs a tensor of at least one dimension")
    dim0 = tensor.shape[0]
    if splits is None:
        if dim0 % n:
            raise ValueError(
                f"alltoall without splits needs dim 0 ({dim0}) divisible by the set size ({n})"
            )
        return (dim0 // n,) * n
    if isinstance(splits, torch.Tensor):
        if splits.dtype != torch.int32:
            raise ValueError(f"splits must be an int32 tensor, got {splits.dtype}")
        values = [int(v) for v in splits.reshape(-1).tolist()]
    else:
        values = [int(v) for v in splits]
    if len(values) != n:
        raise ValueError(f"splits has {len(values)} entries for a set of {n} ranks")
    if any(v < 0 for v in values):
        raise ValueError(f"splits must not be negative: {values}")
    if sum(values) > dim0:
        raise ValueError(f"the sum of splits ({sum(values)}) exceeds dim 0 ({dim0})")
    return tuple(values)


def _first_of_first(outputs: list[Any]) -> Any:
    return outputs[0][0]


def _alltoall(
    form: Form,
    tensors: Tensors,
    splits: torch.Tensor | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    (tensor,) = tensors
    return submit_alltoall(tensor, splits, name, process_set, splits is not None)


alltoall_async = handle_form(
    _alltoall,
    "alltoall_async",
    "Start an alltoall: rows `splits[i]` go to rank i of the set (even split when None).",
)


# ----- reducescatter ---------------------------------------------------------------------------
def submit_reducescatter(
    tensors: Tensors,
    name: str | None,
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
    grouped: bool,
) -> int:
    """Start a reducescatter of `tensors` (a list out when `grouped`); Average and Sum only."""
    if op == Adasum:
        raise NotImplementedError("Adasum is not implemented in hora.torch")
    if op not in (Average, Sum):
        raise ValueError("reducescatter supports only op=Average and op=Sum")
    _need_dimensions(tensors, "reducescatter")
    return submit(
        REDUCESCATTER,
        tensors,
        name,
        process_set,
        inplace=False,
        finish=list if grouped else first,
        grouped=grouped,
        op=op,
        prescale=float(prescale_factor),
        postscale=float(postscale_factor),
    )


def _reducescatter(
    form: Form,
    tensors: Tensors,
    name: str | None = None,
    op: int = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    return submit_reducescatter(
        tensors, name, op, prescale_factor, postscale_factor, process_set, form.grouped
    )


reducescatter_async = handle_form(
    _reducescatter,
    "reducescatter_async",
    "Start a reducescatter: reduce, then rank i keeps the i-th block of rows.",
)
grouped_reducescatter_async = grouped_handle_form(
    _reducescatter, "grouped_reducescatter_async", None
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


# mypy reads no computed __all__ (it would export nothing); without one it sees every public name.
if not TYPE_CHECKING:
    __all__ = [
        "Adasum",
        "Average",
        "HorovodInternalError",
        "Max",
        "Min",
        "ProcessSet",
        "Product",
        "Sum",
        "global_process_set",
        "join",
        "poll",
        "synchronize",
        *op_faces("collectives"),
    ]
