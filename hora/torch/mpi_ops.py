"""Horovod's collectives (`horovod.torch.mpi_ops`): sync, async, in-place and grouped forms.

Every call builds a request (name, shapes, dtypes, op) and hands it to the background engine,
which negotiates it by name with the other ranks; the sync forms are `synchronize(*_async(...))`,
wrapped in autograd functions where Horovod makes them differentiable.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from hora.torch import _state
from hora.torch._basics import (
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
)
from hora.torch._common import (
    OP_NAMES,
    Adasum,
    Average,
    HorovodInternalError,
    Max,
    Min,
    Product,
    Sum,
)
from hora.torch._dtypes import dtype_name
from hora.torch._engine import Op
from hora.torch._execute import GroupInfo, LocalOp
from hora.torch._negotiation import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    BARRIER,
    BROADCAST,
    REDUCESCATTER,
    Request,
)
from hora.torch._process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from hora.torch.compression import Compression, Compressor

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
    operation pays this (a model's 200 small gradients: 200 times a step), hence plain loops
    and cached dtype names."""
    _check_tensors(tensors, grouped)
    state, _ = _group(process_set)
    engine = state.engine
    ps_id: int = process_set.process_set_id  # type: ignore[assignment]
    full = f"{kind}.{name}" if name is not None else engine.generated_name(kind, ps_id)
    dtypes, shapes, nbytes = [], [], 0
    for t in tensors:
        dtypes.append(_dtype_name(t.dtype))
        shapes.append(tuple(t.shape))
        nbytes += t.nbytes  # one call, not numel() * element_size()
    device = "cuda" if tensors and tensors[0].is_cuda else "cpu"
    request = Request(
        full,
        kind,
        ps_id,
        tuple(dtypes),
        tuple(shapes),
        device,
        nbytes,
        op,
        prescale,
        postscale,
        root,
        splits,
    )
    local = LocalOp(list(tensors), inplace)
    if device == "cuda":  # the engine waits for the kernels queued so far on this stream
        local.ready = torch.cuda.Event()
        local.ready.record()
    return engine.submit(Op(request, local, finish), flush)


def _first(outputs: list[Any]) -> Any:
    return outputs[0]


def _none(outputs: list[Any]) -> None:
    return None


def _resolve_op(average: bool | None, op: int | None) -> int:
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average; please provide only one of them.")
    if average is not None:
        warnings.warn(
            "Parameter `average` has been replaced with `op` and will be removed",
            DeprecationWarning,
            stacklevel=3,
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


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Reduce `tensor` over the ranks (Average by default); differentiable."""
    from hora.torch._autograd import HorovodAllreduce

    op = _resolve_op(average, op)
    compressed, ctx = compression.compress(tensor)
    reduced = HorovodAllreduce.apply(
        compressed, name, op, prescale_factor, postscale_factor, process_set
    )
    return compression.decompress(reduced, ctx)


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


def grouped_allreduce(
    tensors: Tensors,
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Reduce a list of tensors in one fused operation; differentiable."""
    from hora.torch._autograd import HorovodGroupedAllreduce

    op = _resolve_op(average, op)
    pairs = [compression.compress(t) for t in tensors]
    reduced = HorovodGroupedAllreduce.apply(
        name, op, prescale_factor, postscale_factor, process_set, *[p[0] for p in pairs]
    )
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(reduced, pairs, strict=True)]


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


def allgather(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """Concatenate every rank's `tensor` on dim 0; differentiable."""
    from hora.torch._autograd import HorovodAllgather

    return HorovodAllgather.apply(tensor, name, process_set)


def grouped_allgather_async(
    tensors: Tensors, name: str | None = None, process_set: ProcessSet = global_process_set
) -> int:
    return _allgather_async(list(tensors), name, process_set, True)


def grouped_allgather(
    tensors: Tensors, name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[torch.Tensor]:
    """Allgather a list of tensors in one fused operation; differentiable."""
    from hora.torch._autograd import HorovodGroupedAllgather

    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


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


def broadcast(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """The root's tensor on every rank; differentiable."""
    from hora.torch._autograd import HorovodBroadcast

    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


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


def alltoall(
    tensor: torch.Tensor,
    splits: torch.Tensor | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Scatter rows to every rank and gather theirs: the output, plus received splits if given."""
    from hora.torch._autograd import HorovodAlltoall

    output, received = HorovodAlltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


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


def reducescatter(
    tensor: torch.Tensor,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Reduce over the ranks and keep this rank's block of rows; differentiable."""
    from hora.torch._autograd import HorovodReducescatter

    compressed, ctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(
        compressed, name, op, prescale_factor, postscale_factor, process_set
    )
    return compression.decompress(out, ctx)


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


def grouped_reducescatter(
    tensors: Tensors,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Reducescatter a list of tensors as one operation; differentiable."""
    from hora.torch._autograd import HorovodGroupedReducescatter

    pairs = [compression.compress(t) for t in tensors]
    outs = HorovodGroupedReducescatter.apply(
        name, op, prescale_factor, postscale_factor, process_set, *[p[0] for p in pairs]
    )
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(outs, pairs, strict=True)]


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
    "add_process_set",
    "allgather",
    "allgather_async",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "sparse_allreduce_async",
    "synchronize",
]
