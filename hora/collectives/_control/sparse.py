"""Allreduce of a sparse COO tensor, as Horovod does it: an allgather of its indices and one of
its values (only the non-zero rows travel), coalesced on every rank. Average and Sum only."""

from __future__ import annotations

import torch

from hora.collectives._common import Average, Sum
from hora.collectives._control import state as _state
from hora.collectives._control.process_sets import ProcessSet
from hora.collectives._control.requests import first, group_of, submit
from hora.collectives._messages import ALLGATHER


class SparseHandle:
    """What `sparse_allreduce_async` returns: `synchronize(handle)` (or `handle()`, as Horovod's
    handle is a function) waits for both allgathers and gives the reduced sparse tensor."""

    __slots__ = ("_divisor", "_indices", "_shape", "_values")

    def __init__(self, indices: int, values: int, shape: torch.Size, divisor: int) -> None:
        self._indices, self._values, self._shape, self._divisor = indices, values, shape, divisor

    def poll(self) -> bool:
        loop = _state.get().loop
        return loop.poll(self._indices) and loop.poll(self._values)

    def __call__(self) -> torch.Tensor:
        loop = _state.get().loop
        values = loop.synchronize(self._values)
        indices = loop.synchronize(self._indices)
        if self._divisor > 1:
            values = values / self._divisor
        # Duplicate indices (the same row from several ranks) are summed by coalescing.
        return torch.sparse_coo_tensor(
            indices.t(), values, self._shape, check_invariants=False
        ).coalesce()  # (explicit: torch warns on every call that leaves the checks implicit)


def sparse_allreduce_async(
    tensor: torch.Tensor, name: str | None, op: int, process_set: ProcessSet
) -> SparseHandle:
    """Start reducing a sparse COO tensor (see the module's docstring)."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async needs a sparse COO tensor; use allreduce")
    if op not in (Average, Sum):
        raise ValueError("sparse_allreduce_async supports only op=Average and op=Sum")
    group_of(process_set)
    t = tensor.coalesce()
    # Allgather concatenates on dim 0: indices travel transposed, one row per non-zero.
    parts = {"indices": t.indices().t().contiguous(), "values": t.values().contiguous()}
    indices, values = (
        submit(
            ALLGATHER,
            [part],
            None if name is None else f"{name}.{what}",
            process_set,
            inplace=False,
            finish=first,
        )
        for what, part in parts.items()
    )
    divisor = len(process_set.ranks) if op == Average else 1
    return SparseHandle(indices, values, t.shape, divisor)
