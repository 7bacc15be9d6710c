"""Horovod's collectives, framework-neutral: the async, in-place and grouped forms.

Every call builds a request (name, shapes, dtypes, op) and hands it to the background engine,
which negotiates it by name with the other ranks; the sync forms are `synchronize(*_async(...))`.
The differentiable forms are the frameworks' (hora.torch._autograd, hora.tensorflow).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from hora.collectives import _state
from hora.collectives._common import (
    OP_NAMES,
    Adasum,
    Average,
    HorovodInternalError,
    Max,
    Min,
    Product,
    Sum,
)
from hora.collectives._dtypes import dtype_name
from hora.collectives._engine import Op
from hora.collectives._execute import GroupInfo, LocalOp
from hora.collectives._negotiation import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    BARRIER,
    BROADCAST,
    REDUCESCATTER,
    Request,
)
from hora.collectives._process_sets import ProcessSet, global_process_set

Tensors = Sequence[torch.Tensor]


# ----- request building ------------------------------------------------------------------------
def _group(process_set: ProcessSet) -> tuple[_state.State, GroupInfo]:
    state = _state.get()
    ps_id = process_set.process_set_id
    info = state.groups.get(ps_id) if ps_id is not None else None
    if info is None or state.process_sets.get(ps_id) is not process_set:  # type: ignore[arg-type]
        raise ValueError(f"{process_set} is not registered; use hvd.add_process_set()")
    if info.index < 0:
        raise ValueError(f"Rank {state.rank} is not a member of {process_set}")
    return state, info


def _check_tensors(tensors: Tensors, grouped: bool) -> None:
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
        if not t.is_contiguous():
            raise ValueError("Tensors passed to Horovod collectives must be contiguous")
        if t.is_sparse:
            raise ValueError("Sparse tensors are not supported; densify them or use allgather")
    if grouped and len({t.device for t in tensors}) > 1:
        raise ValueError("All tensors of a grouped operation must be on the same device")


_DTYPE_NAMES: dict[torch.dtype, str] = {}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype_name(dtype)
    return name


# Full names ("allreduce.<name>") made once per name and reused: every later lookup of the same
# string object (the engine's, the coordinator's, their cache keys) finds its hash computed and
# compares by identity. A training loop submits the same few hundred names every step.
_FULL_NAMES: dict[tuple[str, str], str] = {}
_MAX_FULL_NAMES = 1 << 16


def _full_name(kind: str, name: str) -> str:
    if len(_FULL_NAMES) >= _MAX_FULL_NAMES:
        _FULL_NAMES.clear()  # names made per call (a counter in them): never let them pile up
    full = _FULL_NAMES[(kind, name)] = f"{kind}.{name}"
    return full


# A training loop submits the same requests step after step: a one-tensor request is built once
# per name, tensor signature and parameters, and the same object is sent again. Building one
# costs ~1.3 us, finding it ~0.5 us; and the engine and rank 0 then recognise a cached request
# by identity instead of comparing its twelve fields.
_REQUESTS: dict[tuple[Any, ...], Request] = {}
_MAX_REQUESTS = 1 << 14


def _submit(
    kind: str,
    tensors: Tensors,
    name: str | None,
    process_set: ProcessSet,
    *,
    inplace: bool,
    finish: Any,
    grouped: bool = False,
    op: int = Sum,
    prescale: float = 1.0,
    postscale: float = 1.0,
    root: int = -1,
    splits: tuple[tuple[int, ...], ...] | None = None,
    flush: bool = False,
) -> int:
    """Build the request and hand it to the engine (`flush`: see `Engine.submit`). Every
    operation pays this (a model's 200 small gradients: 200 times a step), hence the inline
    checks and the requests made once (`_REQUESTS`)."""
    state = _state.current
    ps_id: int = process_set.process_set_id  # type: ignore[assignment]
    if (
        state is None
        or state.process_sets.get(ps_id) is not process_set
        or state.groups[ps_id].index < 0
    ):
        _group(process_set)  # raises the error that says what is wrong
    engine = state.engine  # type: ignore[union-attr]
    if name is None:
        full = engine.generated_name(kind, ps_id)
    else:
        full = _FULL_NAMES.get((kind, name))  # type: ignore[assignment]
        if full is None:
            full = _full_name(kind, name)
    if len(tensors) == 1 and name is not None:  # most calls: checks inline, request reused
        t = tensors[0]
        if not isinstance(t, torch.Tensor) or not t.is_contiguous() or t.is_sparse:
            _check_tensors(tensors, grouped)
        signature = (t.dtype, t.shape, t.is_cuda, op, prescale, postscale, root, splits)
        key = (full, kind, ps_id, signature)
        request = _REQUESTS.get(key)  # type: ignore[assignment]
        if request is None:
            if len(_REQUESTS) >= _MAX_REQUESTS:
                _REQUESTS.clear()  # names made per call (a step in them): never let them pile up
            request = _REQUESTS[key] = _request(
                full, kind, ps_id, tensors, op, prescale, postscale, root, splits
            )
    else:  # generated names never recur: nothing to reuse
        _check_tensors(tensors, grouped)
        request = _request(full, kind, ps_id, tensors, op, prescale, postscale, root, splits)
    local = LocalOp(list(tensors), inplace)
    if request.device == "cuda":  # the engine waits for the kernels queued so far on this stream
        local.ready = torch.cuda.Event()
        local.ready.record()
    return engine.submit(Op(request, local, finish), flush)


def _request(
    full: str,
    kind: str,
    ps_id: int,
    tensors: Tensors,
    op: int,
    prescale: float,
    postscale: float,
    root: int,
    splits: tuple[tuple[int, ...], ...] | None,
) -> Request:
    """The request for `tensors`, every field worked out (`_submit` reuses it when it can)."""
    names, sizes, nbytes = [], [], 0
    for t in tensors:
        names.append(_DTYPE_NAMES.get(t.dtype) or _dtype_name(t.dtype))
        sizes.append(tuple(t.shape))
        nbytes += t.nbytes  # one call, not numel() * element_size()
    device = "cuda" if tensors and tensors[0].is_cuda else "cpu"
    return Request(
        full,
        kind,
        ps_id,
        tuple(names),
        tuple(sizes),
        device,
        nbytes,
        op,
        prescale,
        postscale,
        root,
        splits,
    )


def _first(outputs: list[Any]) -> Any:
    return outputs[0]


def _none(outputs: list[Any]) -> None:
    return None


def _resolve_op(average: bool | None, op: int | None, stacklevel: int = 3) -> int:
    """`stacklevel`: where the `average` deprecation points, the user's call by default."""
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


# ----- allreduce -------------------------------------------------------------------------------
def _allreduce_async(
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
    return _submit(
        ALLREDUCE,
        tensors,
        name,
        process_set,
        inplace=inplace,
        finish=list if grouped else _first,
        grouped=grouped,
        op=op,
        prescale=float(prescale_factor),
        postscale=float(postscale_factor),
        flush=flush,
    )


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
    op = _resolve_op(average, op)
    return _allreduce_async(
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
    op = _resolve_op(average, op)
    return _allreduce_async(
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
    op = _resolve_op(average, op)  # here, so a deprecation warning names the caller's line
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
    op = _resolve_op(average, op)
    return _allreduce_async(
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
    op = _resolve_op(average, op)
    return _allreduce_async(
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
    op = _resolve_op(average, op)  # here, so a deprecation warning names the caller's line
    return synchronize(
        grouped_allreduce_async_(
            tensors, None, name, op, prescale_factor, postscale_factor, process_set
        )
    )


# ----- allgather -------------------------------------------------------------------------------
def _allgather_async(
    tensors: Tensors, name: str | None, process_set: ProcessSet, grouped: bool
) -> int:
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dim() == 0:
            raise ValueError("allgather needs tensors of at least one dimension")
    return _submit(
        ALLGATHER,
        tensors,
        name,
        process_set,
        inplace=False,
        finish=list if grouped else _first,
        grouped=grouped,
    )


def allgather_async(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> int:
    """Start an allgather (concatenation on dim 0; dim 0 may differ between ranks)."""
    return _allgather_async([tensor], name, process_set, False)


def grouped_allgather_async(
    tensors: Tensors, name: str | None = None, process_set: ProcessSet = global_process_set
) -> int:
    return _allgather_async(list(tensors), name, process_set, True)


# ----- sparse allreduce ------------------------------------------------------------------------
class SparseHandle:
    """What `sparse_allreduce_async` returns: `synchronize(handle)` (or `handle()`, as Horovod's
    handle is a function) waits for both allgathers and gives the reduced sparse tensor."""

    __slots__ = ("_divisor", "_indices", "_shape", "_values")

    def __init__(self, indices: int, values: int, shape: torch.Size, divisor: int) -> None:
        self._indices, self._values, self._shape, self._divisor = indices, values, shape, divisor

    def poll(self) -> bool:
        return poll(self._indices) and poll(self._values)

    def __call__(self) -> torch.Tensor:
        values = synchronize(self._values)
        indices = synchronize(self._indices)
        if self._divisor > 1:
            values = values / self._divisor
        # Duplicate indices (the same row from several ranks) are summed by coalescing.
        return torch.sparse_coo_tensor(
            indices.t(), values, self._shape, check_invariants=False
        ).coalesce()  # (explicit: torch warns on every call that leaves the checks implicit)


def sparse_allreduce_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
) -> SparseHandle:
    """Start reducing a sparse COO tensor as Horovod does: an allgather of its indices and one
    of its values (only the non-zero rows travel). Average and Sum only."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async needs a sparse COO tensor; use allreduce")
    if op not in (Average, Sum):
        raise ValueError("sparse_allreduce_async supports only op=Average and op=Sum")
    _group(process_set)
    t = tensor.coalesce()
    # Allgather concatenates on dim 0: indices travel transposed, one row per non-zero.
    indices = _allgather_async(
        [t.indices().t().contiguous()],
        None if name is None else f"{name}.indices",
        process_set,
        False,
    )
    values = _allgather_async(
        [t.values().contiguous()], None if name is None else f"{name}.values", process_set, False
    )
    divisor = len(process_set.ranks) if op == Average else 1
    return SparseHandle(indices, values, t.shape, divisor)


# ----- broadcast -------------------------------------------------------------------------------
def _broadcast_async(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None,
    process_set: ProcessSet,
    inplace: bool,
) -> int:
    root = int(root_rank)
    state = _state.get()
    if not 0 <= root < state.size:
        raise ValueError(f"root_rank {root} is not a rank of a world of {state.size}")
    return _submit(
        BROADCAST, [tensor], name, process_set, inplace=inplace, finish=_first, root=root
    )


def broadcast_async(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start an out-of-place broadcast from global rank `root_rank`; the source stays untouched."""
    return _broadcast_async(tensor, root_rank, name, process_set, False)


def broadcast_async_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start an in-place broadcast: `tensor` receives the root's values."""
    return _broadcast_async(tensor, root_rank, name, process_set, True)


def broadcast_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Broadcast in place and return `tensor`."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ----- alltoall --------------------------------------------------------------------------------
def _split_list(tensor: torch.Tensor, splits: Any, n: int) -> tuple[int, ...]:
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


def _alltoall_async(
    tensor: torch.Tensor,
    splits: torch.Tensor | None,
    name: str | None,
    process_set: ProcessSet,
    with_received: bool,
) -> int:
    """Start an alltoall; its handle yields `(output, received_splits)` when `with_received`."""
    _, info = _group(process_set)
    values = _split_list(tensor, splits, info.size)
    return _submit(
        ALLTOALL,
        [tensor],
        name,
        process_set,
        inplace=False,
        finish=_first if with_received else _first_of_first,
        splits=(values,),
    )


def _first_of_first(outputs: list[Any]) -> Any:
    return outputs[0][0]


def alltoall_async(
    tensor: torch.Tensor,
    splits: torch.Tensor | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start an alltoall: rows `splits[i]` go to rank i of the set (even split when None)."""
    return _alltoall_async(tensor, splits, name, process_set, splits is not None)


# ----- reducescatter ---------------------------------------------------------------------------
def _reducescatter_async(
    tensors: Tensors,
    name: str | None,
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
    grouped: bool,
) -> int:
    if op == Adasum:
        raise NotImplementedError("Adasum is not implemented in hora.torch")
    if op not in (Average, Sum):
        raise ValueError("reducescatter supports only op=Average and op=Sum")
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dim() == 0:
            raise ValueError("reducescatter needs tensors of at least one dimension")
    return _submit(
        REDUCESCATTER,
        tensors,
        name,
        process_set,
        inplace=False,
        finish=list if grouped else _first,
        grouped=grouped,
        op=op,
        prescale=float(prescale_factor),
        postscale=float(postscale_factor),
    )


def reducescatter_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: int = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start a reducescatter: reduce, then rank i keeps the i-th block of rows."""
    return _reducescatter_async(
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
    return _reducescatter_async(
        list(tensors), name, op, prescale_factor, postscale_factor, process_set, True
    )


# ----- synchronisation -------------------------------------------------------------------------
def poll(handle: int | SparseHandle) -> bool:
    """True once the operation behind `handle` has finished (never blocks)."""
    if type(handle) is SparseHandle:
        return handle.poll()
    return _state.get().engine.poll(handle)  # type: ignore[arg-type]


def synchronize(handle: int | SparseHandle) -> Any:
    """Wait for `handle` and return its output; raises HorovodInternalError if it failed."""
    if type(handle) is SparseHandle:
        return handle()
    return _state.get().engine.synchronize(handle)  # type: ignore[arg-type]


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return once every rank of the set has called barrier."""
    synchronize(_submit(BARRIER, [], None, process_set, inplace=False, finish=_none))


def join(device: int = -1) -> int:
    """Wait until every rank has joined; until then this rank contributes zeros to the others'
    allreduces and reducescatters, while their allgathers, broadcasts and alltoalls raise
    HorovodInternalError (as in Horovod). Returns the last rank to join."""
    state = _state.get()
    if device >= 0 and torch.cuda.is_available():
        torch.cuda.set_device(device)
    op = Op(None, LocalOp([], False), _first)
    return int(synchronize(state.engine.submit(op)))


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
