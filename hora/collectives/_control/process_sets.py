"""Process sets: collectives over a subset of ranks, each with its own transports' groups."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from hora.collectives._control import state as _state
from hora.collectives._data.groups import make_groups
from hora.collectives._messages import ProcessSetChange


class ProcessSet:
    """A sorted set of global ranks; `process_set_id` is None until registered."""

    def __init__(self, ranks: Sequence[int]) -> None:
        self.ranks: list[int] = sorted({int(r) for r in ranks})
        self.process_set_id: int | None = None

    def _registered(self) -> bool:
        state = _state.current
        return (
            state is not None
            and self.process_set_id is not None
            and state.process_sets.get(self.process_set_id) is self
        )

    def size(self) -> int | None:
        """Number of ranks, None while not registered."""
        return len(self.ranks) if self._registered() else None

    def rank(self) -> int | None:
        """This process's rank within the set (-1 when not included), None while not registered."""
        if not self._registered():
            return None
        me = _state.get().rank
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self) -> bool | None:
        """Whether this process belongs to the set, None while not registered."""
        if not self._registered():
            return None
        return _state.get().rank in self.ranks

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def register(process_set: ProcessSet, timeout: timedelta) -> ProcessSet:
    """Give `process_set` an id and groups (all ranks call it with the same sets, in order)."""
    state = _state.get()
    if process_set.process_set_id is not None and process_set.process_set_id in state.process_sets:
        raise ValueError(f"{process_set} is already registered")
    for existing in state.process_sets.values():
        if existing.ranks == process_set.ranks:
            raise ValueError(f"A process set with ranks {process_set.ranks} already exists")
    bad = [r for r in process_set.ranks if not 0 <= r < state.size]
    if bad or not process_set.ranks:
        raise ValueError(f"Invalid ranks {process_set.ranks} for a world of {state.size}")
    ps_id = state.next_process_set_id
    state.next_process_set_id += 1
    info = make_groups(process_set.ranks, state.rank, timeout)
    state.groups[ps_id] = info
    state.loop.control(ProcessSetChange(ps_id, info.ranks))
    process_set.process_set_id = ps_id
    state.process_sets[ps_id] = process_set
    return process_set
