"""Helpers above the collectives: broadcast a model, an optimizer's state, any Python object.

They are what a Horovod script calls once after `hvd.init()` so that every rank starts from rank
0's weights, and again when restoring a checkpoint that only rank 0 read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from hora.collectives.objects import allgather_object as allgather_object
from hora.collectives.objects import broadcast_object as broadcast_object
from hora.torch.mpi_ops import (
    ProcessSet,
    broadcast_async_,
    global_process_set,
    rank,
    synchronize,
)

__all__ = [
    "allgather_object",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
]

Params = Mapping[str, torch.Tensor] | Iterable[torch.Tensor | tuple[str, torch.Tensor]]


def broadcast_parameters(
    params: Params, root_rank: int, process_set: ProcessSet = global_process_set
) -> None:
    """Overwrite `params` in place with `root_rank`'s values.

    `params` is a `state_dict()`-like mapping (broadcast in sorted key order, so every rank meets
    the same names) or a list of tensors or `(name, tensor)` pairs. A bare generator such as
    `model.parameters()` is refused: it may already be consumed, and a list says the order.
    """
    if isinstance(params, Mapping):
        items: list[tuple[str | None, torch.Tensor]] = sorted(params.items())
    elif isinstance(params, list | tuple):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(
            f"invalid params of type: {type(params).__name__}; pass model.state_dict(), "
            "list(model.named_parameters()) or a list of tensors"
        )
    handles = []
    for name, tensor in items:
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"broadcast_parameters: {name or 'an item'} is not a tensor")
        # detach(): the same storage without autograd's in-place checks on leaf parameters.
        handles.append(broadcast_async_(tensor.detach(), root_rank, name, process_set=process_set))
    for handle in handles:
        synchronize(handle)


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer,
    root_rank: int,
    model: torch.nn.Module | None = None,
    process_set: ProcessSet = global_process_set,
) -> None:
    """Make every rank's optimizer state and options (lr, momentum, betas, ...) `root_rank`'s.

    An optimizer that has not stepped yet has no state to receive into; it is given one by a
    step on zero gradients, with the weights saved and put back so they do not move (weight
    decay would otherwise shift them); parameters that had no gradient keep the zero one, as
    Horovod leaves them (scripts go on to broadcast or read those gradients). `model` is
    accepted for Horovod compatibility.
    LBFGS keeps closures and history in its state and is refused, as in Horovod.
    """
    del model
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not optimizer.state:
        _initialise_state(optimizer, params)

    is_root = rank() == root_rank
    meta = _state_layout(optimizer, params) if is_root else None
    meta = broadcast_object(
        meta, root_rank, name="broadcast_optimizer_state.layout", process_set=process_set
    )

    for group, options in zip(optimizer.param_groups, meta["groups"], strict=True):
        for key, value in options.items():
            group[key] = value
    tensors: dict[str, torch.Tensor] = {}
    for index, entries in meta["state"].items():
        state = optimizer.state[params[index]]
        for key, (kind, value) in entries.items():
            if kind == "value":
                state[key] = value
                continue
            shape, dtype, device = value
            local = state.get(key)
            if not (
                isinstance(local, torch.Tensor)
                and local.shape == shape
                and local.dtype == dtype
                and local.is_contiguous()
            ):
                local = torch.zeros(shape, dtype=dtype, device=_device_like(device, params[index]))
                state[key] = local
            tensors[f"optimizer_state.{index}.{key}"] = local
    broadcast_parameters(tensors, root_rank, process_set=process_set)


def _initialise_state(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
    saved = [(p, p.detach().clone(), p.grad) for p in params if p.requires_grad]
    sparse = isinstance(optimizer, torch.optim.SparseAdam)
    for p, _, _ in saved:
        zeros = torch.zeros_like(p.detach())
        p.grad = zeros.to_sparse() if sparse else zeros
    step_without_sync = getattr(optimizer, "_step_without_sync", None)
    with torch.no_grad():
        if step_without_sync is not None:  # a DistributedOptimizer must not reduce here
            step_without_sync()
        else:
            optimizer.step()
        for p, value, grad in saved:
            p.copy_(value)
            if grad is not None:  # as in Horovod, a parameter that had none keeps the zeros
                p.grad = grad


def _state_layout(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> dict[str, Any]:
    """What root sends first: options by value, and each state tensor's shape and dtype."""
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    index_of = {id(p): i for i, p in enumerate(params)}
    state: dict[int, dict[str, tuple[str, Any]]] = {}
    for param, entries in optimizer.state.items():
        if id(param) not in index_of:
            continue
        state[index_of[id(param)]] = {
            key: ("tensor", (tuple(v.shape), v.dtype, v.device.type))
            if isinstance(v, torch.Tensor)
            else ("value", v)
            for key, v in entries.items()
        }
    return {"groups": groups, "state": state}


def _device_like(device_type: str, param: torch.Tensor) -> torch.device:
    return torch.device("cpu") if device_type == "cpu" else param.device
