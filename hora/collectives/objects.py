"""Python objects across ranks: cloudpickled to bytes and sent through the collective loop's
broadcast and allgather. hora.torch and hora.tensorflow both offer them (Horovod's
`broadcast_object`, `allgather_object`)."""

from __future__ import annotations

import io
from typing import Any

import cloudpickle
import torch

from hora.collectives._basics import rank
from hora.collectives._control.process_sets import ProcessSet, global_process_set
from hora.collectives.ops import allgather_async, broadcast_, synchronize

__all__ = ["allgather_object", "broadcast_object"]


def broadcast_object(
    obj: Any,
    root_rank: int = 0,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Return `root_rank`'s `obj` on every rank (cloudpickled, sent as bytes).

    The default name does not depend on `obj`'s type, unlike Horovod's: non-root ranks often
    pass None, and name-matched operations with different names would never meet.
    """
    name = name or "broadcast_object"
    if rank() == root_rank:
        payload = _to_bytes(obj)
        size = torch.tensor([payload.numel()], dtype=torch.int64)
        broadcast_(size, root_rank, f"{name}.sz", process_set=process_set)
    else:
        size = torch.zeros(1, dtype=torch.int64)
        broadcast_(size, root_rank, f"{name}.sz", process_set=process_set)
        payload = torch.zeros(int(size.item()), dtype=torch.uint8)
    broadcast_(payload, root_rank, f"{name}.t", process_set=process_set)
    if rank() == root_rank:
        return obj
    return _from_bytes(payload)


def allgather_object(
    obj: Any, name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[Any]:
    """Return every rank's `obj` in the process set's rank order (cloudpickled, sent as bytes)."""
    name = name or "allgather_object"
    payload = _to_bytes(obj)
    sizes = synchronize(
        allgather_async(
            torch.tensor([payload.numel()], dtype=torch.int64),
            name=f"{name}.sz",
            process_set=process_set,
        )
    ).tolist()
    gathered = synchronize(allgather_async(payload, name=f"{name}.t", process_set=process_set))
    out, start = [], 0
    for size in sizes:
        out.append(_from_bytes(gathered[start : start + size]))
        start += size
    return out


def _to_bytes(obj: Any) -> torch.Tensor:
    return torch.frombuffer(bytearray(cloudpickle.dumps(obj)), dtype=torch.uint8)


def _from_bytes(tensor: torch.Tensor) -> Any:
    return cloudpickle.load(io.BytesIO(tensor.numpy().tobytes()))
