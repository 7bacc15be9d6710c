"""Building a collective's request and handing it to the collective loop: what every operation
pays on the caller's thread, kept cheap (a model's 200 small gradients pay it 200 times a step).

A training loop submits the same requests step after step, so the strings and requests built for
a name are made once and reused: the loop and rank 0 then recognise a cached request by
identity instead of comparing its twelve fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hora.collectives._common import Sum
from hora.collectives._control import state as _state
from hora.collectives._control.process_sets import ProcessSet
from hora.collectives._control.submissions import Op
from hora.collectives._data.dtypes import dtype_name
from hora.collectives._data.groups import GroupInfo
from hora.collectives._data.local_op import LocalOp
from hora.collectives._messages import Request

Tensors = Sequence[torch.Tensor]


# ----- request building ------------------------------------------------------------------------
def group_of(process_set: ProcessSet) -> tuple[_state.State, GroupInfo]:
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
# string object (the loop's, the coordinator's, their cache keys) finds its hash computed and
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
# costs ~1.3 us, finding it ~0.5 us; and the loop and rank 0 then recognise a cached request
# by identity instead of comparing its twelve fields.
_REQUESTS: dict[tuple[Any, ...], Request] = {}
_MAX_REQUESTS = 1 << 14


def submit(
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
    """Build the request and hand it to the loop (`flush`: see `CollectiveLoop.submit`). Every
    operation pays this (a model's 200 small gradients: 200 times a step), hence the inline
    checks and the requests made once (`_REQUESTS`)."""
    state = _state.current
    ps_id: int = process_set.process_set_id  # type: ignore[assignment]
    if (
        state is None
        or state.process_sets.get(ps_id) is not process_set
        or state.groups[ps_id].index < 0
    ):
        group_of(process_set)  # raises the error that says what is wrong
    loop = state.loop  # type: ignore[union-attr]
    if name is None:
        full = loop.generated_name(kind, ps_id)
    else:
        full = _FULL_NAMES.get((kind, name))
        if full is None:
            full = _full_name(kind, name)
    if len(tensors) == 1 and name is not None:  # most calls: checks inline, request reused
        t = tensors[0]
        if not isinstance(t, torch.Tensor) or not t.is_contiguous() or t.is_sparse:
            _check_tensors(tensors, grouped)
        signature = (t.dtype, t.shape, t.is_cuda, op, prescale, postscale, root, splits)
        key = (full, kind, ps_id, signature)
        request = _REQUESTS.get(key)
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
    if request.device == "cuda":  # the loop waits for the kernels queued so far on this stream
        local.ready = torch.cuda.Event()
        local.ready.record()
    return loop.submit(Op(request, local, finish), flush)


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
    """The request for `tensors`, every field worked out (`submit` reuses it when it can)."""
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


def first(outputs: list[Any]) -> Any:
    return outputs[0]
