"""What a framework API (hora.torch, hora.tensorflow) builds on, beyond Horovod's own calls.

Horovod's calls are `hora.collectives` (its `__all__`), which a framework re-exports. To add its
gradients and tensor types, a framework also needs each collective's request with every argument
explicit (`submit_*`: a handle that `synchronize` waits for), the op resolution that keeps
Horovod's `average=` deprecation (`resolve_op`), the operations' names, the errors it maps to its
own, and a registered process set by its id. Horovod's own calls in `ops` are built on the same
`submit_*`.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from hora.collectives._common import (
    OP_NAMES,
    Adasum,
    Average,
    CollectiveRefusedError,
    HostsUpdatedInterrupt,
    Sum,
)
from hora.collectives._control import state as _state
from hora.collectives._control.process_sets import ProcessSet
from hora.collectives._control.requests import Tensors, alltoall_splits, first, group_of, submit
from hora.collectives._control.sparse import SparseHandle
from hora.collectives._messages import ALLGATHER, ALLREDUCE, ALLTOALL, BROADCAST, REDUCESCATTER

__all__ = [
    "ALLGATHER",
    "ALLREDUCE",
    "ALLTOALL",
    "BROADCAST",
    "REDUCESCATTER",
    "CollectiveRefusedError",
    "HostsUpdatedInterrupt",
    "SparseHandle",
    "Tensors",
    "process_set_by_id",
    "resolve_op",
    "submit_allgather",
    "submit_allreduce",
    "submit_alltoall",
    "submit_broadcast",
    "submit_reducescatter",
]


def resolve_op(average: bool | None, op: int | None, stacklevel: int = 3) -> int:
    """The reduction op a call's `average=` or `op=` asks for (Average when neither does).
    `stacklevel`: where the `average` deprecation points, the user's call by default."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average; please provide only one of them.")
    if average is not None:
        warnings.warn(
            "Parameter `average` has been replaced with `op` and will be removed",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
        op = Average if average else Sum
    if op is None:
        op = Average
    if op == Adasum:
        raise NotImplementedError(
            "Adasum is not implemented in hora.torch; use op=hvd.Average or op=hvd.Sum"
        )
    if op not in OP_NAMES:
        raise ValueError(f"Unknown reduction op {op!r}")
    return op


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


def submit_alltoall(
    tensor: torch.Tensor,
    splits: torch.Tensor | None,
    name: str | None,
    process_set: ProcessSet,
    with_received: bool,
) -> int:
    """Start an alltoall; its handle yields `(output, received_splits)` when `with_received`."""
    _, info = group_of(process_set)
    values = alltoall_splits(tensor, splits, info.size)
    return submit(
        ALLTOALL,
        [tensor],
        name,
        process_set,
        inplace=False,
        finish=first if with_received else _first_of_first,
        splits=(values,),
    )


def _first_of_first(outputs: list[Any]) -> Any:
    return outputs[0][0]


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


def process_set_by_id(process_set_id: int) -> ProcessSet | None:
    """The registered process set `process_set_id`, None if there is none (ValueError before
    `init()`)."""
    return _state.get().process_sets.get(int(process_set_id))
