"""A rank's share of the tree's upward half (`tree`): its own round and its children's reports go
up to its parent, and a cached round every rank of its subtree sent alike goes up as one report.

A report is `(rank, whole, drops_applied, items)` (see `_messages`): `whole` False is one rank's
round as it sent it; `whole` True says that every rank of `rank`'s subtree sent exactly the
cache ids `items`, all of the global process set, with `drops_applied` the fewest CacheDrops any
of them had applied (the conservative figure for the response cache's retired ids). Rank 0 then
hears its few children's reports, not the world's.

A training step submits the same operations every time, so once they are cached a round is a
tuple of ids. Such a round is held here until this rank and every child's whole subtree have it,
and sent as one report; anything else (requests, a join, a stop, a differing round, a report
that is not a subtree's) goes up at once, after whatever was held, so each rank's reports keep
their order. A round held longer than `HOLD_S` goes up as it is, so that rank 0's stall
inspector sees who is late, and so do the late senders' reports of that same round when they
come (they are not held again for senders that have sent theirs already). While a rank below
has joined (and no JoinDone has come down), no round is held: the joined rank sends none.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from hora.collectives._messages import Join, JoinDone

# How long a cached round is held for the rest of its subtree before it goes up as it is; rank
# 0 waits as long for the whole world's before it matches the operations one by one.
HOLD_S = 0.25

Report = tuple[int, bool, int, Any]  # (rank, whole subtree, drops applied, items)


class Relay:
    """What this rank sends up next (`out`), and the subtree's cached round it holds."""

    def __init__(
        self, rank: int, children: Collection[int], is_global: Callable[[int], bool]
    ) -> None:
        self.rank = rank
        self._senders = frozenset((rank, *children))  # this rank and each child
        self._is_global = is_global  # whether a cache id is a request of the global set
        self._held: dict[int, Report] = {}  # by sender
        self._ids: tuple[int, ...] = ()
        self._since = 0.0
        # A round sent up before every sender had it: who still owes it, and its ids.
        self._late: set[int] = set()
        self._late_ids: tuple[int, ...] = ()
        self._joined = 0  # ranks below that joined while no JoinDone came down
        self.out: list[Report] = []

    def own(self, drops_applied: int, items: list[Any], now: float) -> None:
        """This rank's round, its requests already encoded as cache ids where known."""
        if items and all(type(i) is int and self._is_global(i) for i in items):
            self._offer(self.rank, (self.rank, False, drops_applied, tuple(items)), now)
            return
        self._pass(self.rank, (self.rank, False, drops_applied, items))

    def child(self, child: int, report: Report, now: float) -> None:
        """A report from (or relayed by) `child`."""
        if report[1] and report[0] == child:
            self._offer(child, report, now)
        else:
            self._pass(child, report)

    def heard(self, responses: list[Any]) -> None:
        """Rank 0's answer, on its way down: a JoinDone ends the joins below."""
        if self._joined and any(type(r) is JoinDone for r in responses):
            self._joined = 0

    def holding(self) -> bool:
        return bool(self._held)

    def due(self) -> float | None:
        """When the round held goes up as it is (None: nothing is held)."""
        return self._since + HOLD_S if self._held else None

    def release(self, now: float) -> None:
        """Send up what was held past `HOLD_S`."""
        if self._held and now >= self._since + HOLD_S:
            self.flush()

    def flush(self) -> None:
        """Send up what is held, each report as it came; the senders that owe that round send
        theirs up as it comes."""
        if self._held:
            self._late = set(self._senders - self._held.keys())
            self._late_ids = self._ids
            self.out.extend(self._held.values())
            self._held = {}

    def take(self) -> list[Report]:
        out, self.out = self.out, []
        return out

    def _offer(self, sender: int, report: Report, now: float) -> None:
        ids = report[3]
        late = self._late
        if sender in late:
            late.discard(sender)
            if ids == self._late_ids:  # its share of a round sent up already
                self.out.append(report)
                return
        held = self._held
        if self._joined or sender in held or (held and ids != self._ids):
            self._pass(sender, report)
            return
        if not held:
            self._ids, self._since = ids, now
        held[sender] = report
        if len(held) == len(self._senders):
            drops = min(r[2] for r in held.values())
            self._held = {}
            self.out.append((self.rank, True, drops, ids))

    def _pass(self, sender: int, report: Report) -> None:
        self.flush()
        self._late.discard(sender)
        if not report[1] and any(type(i) is Join for i in report[3]):
            self._joined += 1
        self.out.append(report)
