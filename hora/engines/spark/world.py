"""Which Spark task runs which rank now, in an elastic run whose world changes in place.

The launcher numbers the first tasks host by host (`start`). A lost rank leaves the world and the
survivors keep their order (as `hora.job.in_place` renumbers them); ranks added to grow it in
place come after the running ones, the new tasks of one host next to each other (`grow`). The
plan a new task gets lists every rank of the larger world, so that its coordinates and its GPUs
(those of its host's ranks, in local-rank order) are computed as for the first ones. Hosts are
named here as Spark names its executors (the driver may know them by their host names): the
same machines, so the same grouping.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hora import environment


@dataclass
class World:
    """The tasks (by slot) of the ranks of the world now, in rank order, and their reports."""

    tasks: dict[int, dict[str, Any]] = field(default_factory=dict)  # slot -> what it reported
    order: list[int] = field(default_factory=list)  # the slots in rank order

    def start(self, slots: list[int]) -> list[int]:
        """The first world: `slots` numbered host by host; returns them in rank order."""
        hosts = [self.tasks[slot]["host"] for slot in slots]
        self.order = [slots[i] for i in environment.host_order(hosts)]
        return list(self.order)

    def lose(self, slot: int) -> None:
        """The rank of `slot` left the world."""
        if slot in self.order:
            self.order.remove(slot)

    def grow(self, slots: list[int], running: int) -> list[dict[str, Any]]:
        """Add `slots`' ranks after the `running` ones; the larger world's ranks (each task's
        report, in rank order). Should this world hold other than `running` ranks (a loss the
        driver saw first), the driver's count wins: the new ranks come after its first ones."""
        hosts = [self.tasks[slot]["host"] for slot in slots]
        slots = [slots[i] for i in environment.host_order(hosts)]
        self.order = self.order[:running] + slots
        return [self.tasks[s] for s in self.order]
