"""Which Spark task runs which rank, in an elastic run whose world grows in place.

The launcher numbers the first tasks host by host (`start`, which also gives each rank the
GPUs `task_gpu_counts` leaves it). Ranks added to grow the world in place come after the
running ones (`grow`: those on a running host first, then new hosts, `engines.joining_order`).
The plan a new task gets lists every rank of the larger world, so that its coordinates and its
GPUs (those of its host's ranks, in local-rank order) are computed as for the first ones. Hosts
are named here as Spark names its executors (the driver knows them by their host names): the
same machines, so the same grouping.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hora import engines


@dataclass
class TaskRanks:
    """Every task's report (by slot), for numbering the ranks they run."""

    tasks: dict[int, dict[str, Any]] = field(default_factory=dict)  # slot -> what it reported

    def start(
        self, slots: list[int], gpu_counts: list[int] | None = None
    ) -> tuple[list[dict[str, Any]], list[int]]:
        """The first world, numbered host by host: every rank's report in rank order, and
        `slots` in rank order. With `gpu_counts` (one per slot: `task_gpu_counts`) each rank
        gets the first GPUs of its task, only those."""
        order = [slots[i] for i in engines.host_order(self._hosts(slots))]
        ranks = [self.tasks[slot] for slot in order]
        if gpu_counts is not None:
            ranks = [
                {**r, "gpus": r["gpus"][: gpu_counts[slot]]}
                for r, slot in zip(ranks, order, strict=True)
            ]
        return ranks, order

    def grow(self, running: list[int], new: list[int]) -> tuple[list[dict[str, Any]], list[int]]:
        """The larger world of the `running` slots' ranks (in rank order) and `new` ones: every
        rank's report in rank order, and the new slots in the order of their ranks."""
        new = [new[i] for i in engines.joining_order(self._hosts(running), self._hosts(new))]
        return [self.tasks[slot] for slot in running + new], new

    def _hosts(self, slots: list[int]) -> list[str]:
        return [self.tasks[slot]["host"] for slot in slots]
