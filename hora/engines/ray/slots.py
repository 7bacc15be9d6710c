"""Which bundle of which placement group each of an attempt's actors sits in, and which are free.

Ray cannot shrink a placement group: a lost actor's bundle stays in it, and when its node is
lost Ray reserves the bundle again where room appears (a node that returns). A slot whose rank
ended under the attempt (its actor lost, or its worker dead under a live actor) is free: a rank
added to grow the attempt in place goes there first, and a free slot whose bundle is reserved on
a live node is room the cluster's free resources do not show (`Slots.spare`). Ranks beyond the
free slots get a placement group of their own, removed with the attempt's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class Slot(NamedTuple):
    """Where one actor sits: bundle `bundle` of the attempt's placement group number `group`."""

    group: int
    bundle: int


class Slots:
    """The attempt's placement groups, one slot per actor (its index in the launcher's list),
    and the free ones: slot -> whether its actor lives on (a worker died under it) and can run
    a new rank itself."""

    def __init__(self) -> None:
        self.groups: list[Any] = []
        self.where: list[Slot] = []
        self.free: dict[int, bool] = {}

    def add_group(self, group: Any, bundles: int) -> list[int]:
        """A placement group of `bundles` bundles: its slots, one per bundle."""
        self.groups.append(group)
        first = len(self.where)
        self.where += [Slot(len(self.groups) - 1, b) for b in range(bundles)]
        return list(range(first, len(self.where)))

    def ended(self, slot: int, actor_alive: bool) -> None:
        """The rank in `slot` ended under the attempt: the slot may run another."""
        self.free[slot] = actor_alive

    def take(self, count: int) -> tuple[list[int], list[int]]:
        """Up to `count` free slots, lowest first: (those whose actor must be made anew, those
        whose actor lives on)."""
        chosen = sorted(self.free)[:count]
        taken = {slot: self.free.pop(slot) for slot in chosen}
        return [s for s, alive in taken.items() if not alive], [s for s, a in taken.items() if a]

    def spare(self, table: Callable[[Any], dict[str, Any]], live: set[str]) -> int:
        """Free slots whose bundle is reserved on a live node (`table`: Ray's
        `placement_group_table`; `live`: the ids of the nodes that answer)."""
        if not self.free:
            return 0
        nodes = self._nodes(table)
        return sum(1 for slot in self.free if nodes(slot) in live)

    def stale(
        self, slots: list[int], table: Callable[[Any], dict[str, Any]], live: set[str]
    ) -> list[int]:
        """Those of `slots` whose bundle Ray still maps to a node that no longer answers: Ray
        has not yet declared the node dead (its health checks take seconds), and an actor
        placed there dies at once. Once it has, the bundle is pending or reserved again."""
        nodes = self._nodes(table)
        return [slot for slot in slots if (node := nodes(slot)) is not None and node not in live]

    def _nodes(self, table: Callable[[Any], dict[str, Any]]) -> Callable[[int], str | None]:
        """Slot -> the id of the node Ray reserved its bundle on (None while it is pending)."""
        nodes = [table(group).get("bundles_to_node_id", {}) for group in self.groups]
        return lambda slot: nodes[self.where[slot].group].get(self.where[slot].bundle)
