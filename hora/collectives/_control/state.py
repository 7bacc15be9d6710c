"""The one piece of global state: what `init()` set up, or None before it and after `shutdown()`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hora.collectives._common import NOT_INITIALIZED
from hora.placement import RankPlacement

if TYPE_CHECKING:
    from hora.collectives._control.loop import CollectiveLoop
    from hora.collectives._data.groups import GroupInfo


@dataclass
class State:
    place: RankPlacement
    loop: CollectiveLoop
    # process set id -> its groups; shared with the loop, which reads it on its thread.
    groups: dict[int, GroupInfo]
    dynamic: bool
    next_process_set_id: int = 1
    process_sets: dict[int, Any] = field(default_factory=dict)  # id -> ProcessSet

    @property
    def rank(self) -> int:
        return self.place.rank

    @property
    def size(self) -> int:
        return self.place.size

    @property
    def local_rank(self) -> int:
        return self.place.local_rank

    @property
    def local_size(self) -> int:
        return self.place.local_size

    @property
    def cross_rank(self) -> int:
        return self.place.cross_rank

    @property
    def cross_size(self) -> int:
        return self.place.cross_size


current: State | None = None


def get() -> State:
    """The state, or Horovod's ValueError when `init()` has not run."""
    if current is None:
        raise ValueError(NOT_INITIALIZED)
    return current


def in_flight() -> list[str]:
    """The collectives this process waits for ("allreduce 'grad.w'"); none before `init()`.

    For a rank's answer to "where are you?" (hora.rank.stacks), so it reads no private state.
    """
    state = current
    return [] if state is None else state.loop.queue.describe()
