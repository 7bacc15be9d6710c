"""A process set as the data room sees it (`GroupInfo`): its ranks, its transports' groups, and the
paths beyond them that `transports` routes through; and making and releasing them.

The shared-memory and hierarchical paths are typed by what the routing calls on them
(`SameHost`, `AcrossHosts`), so that this module needs neither `shm` nor `hierarchy`, which
import `transports` themselves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from hora.collectives._data.fusion import FusionBuffer


class SameHost(Protocol):
    """Reductions among the ranks of one host through shared memory (`shm.LocalReducer`)."""

    def allreduce(
        self,
        src: torch.Tensor,
        dst: torch.Tensor,
        op: int,
        scale: float = 1.0,
        between: Callable[[torch.Tensor], None] | None = None,
    ) -> None: ...

    def allreduce_from_(
        self, tensors: list[torch.Tensor], layout: Any, out: torch.Tensor, op: int, scale: float
    ) -> None: ...

    def fits(self, nbytes: int) -> bool: ...

    def close(self) -> None: ...


class AcrossHosts(Protocol):
    """The hierarchical path of a set on several hosts (`hierarchy.Hierarchy`)."""

    allreduce_on: bool
    allgather_on: bool  # allgather and broadcast

    def allreduce(self, src: torch.Tensor, dst: torch.Tensor, op: int, scale: float) -> None: ...

    def allgather(self, recv: torch.Tensor, send: torch.Tensor) -> None: ...

    def broadcast(self, buf: torch.Tensor, root: int) -> None: ...

    def close(self) -> None: ...


@dataclass
class GroupInfo:
    """A process set as the data path sees it: its ranks and its transports' groups."""

    ranks: tuple[int, ...]
    index: int  # this process's position in `ranks`, -1 when not a member
    gloo: Any = None  # a torch ProcessGroup, None when the set has one member
    nccl: Any = None
    nccl_usable: bool | None = None  # decided at the set's first CUDA collective
    local: SameHost | None = None  # when every member is on this host
    hierarchy: AcrossHosts | None = None  # when the members span several hosts
    fusion: FusionBuffer = field(default_factory=FusionBuffer)

    @property
    def size(self) -> int:
        return len(self.ranks)


def make_groups(ranks: Sequence[int], rank: int, timeout: timedelta) -> GroupInfo:
    """Create a set's gloo and NCCL groups; every rank of the world calls this, in one order."""
    ranks = tuple(ranks)
    gloo = nccl = None
    if len(ranks) > 1:
        gloo = dist.new_group(list(ranks), backend="gloo", timeout=timeout)
        if torch.cuda.is_available() and dist.is_nccl_available():
            nccl = dist.new_group(list(ranks), backend="nccl", timeout=timeout)
    member = rank in ranks
    return GroupInfo(
        ranks=ranks,
        index=ranks.index(rank) if member else -1,
        gloo=gloo if member else None,
        nccl=nccl if member else None,
    )


def destroy_groups(info: GroupInfo) -> None:
    if info.local is not None:
        info.local.close()
        info.local = None
    if info.hierarchy is not None:
        info.hierarchy.close()
        info.hierarchy = None
    for group in (info.gloo, info.nccl):
        if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER:
            with contextlib.suppress(Exception):
                dist.destroy_process_group(group)
