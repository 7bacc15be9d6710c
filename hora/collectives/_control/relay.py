"""A rank's share of the tree's upward half (`tree`): its own round and its children's reports go
up to its parent, and the cached operations its whole subtree has sent go up as one report.

A report is `(rank, whole, drops_applied, items)` (see `_messages`): `whole` False is one rank's
round as it sent it; `whole` True says that every rank of `rank`'s subtree has sent each of the
cache ids `items`, all of the global process set, with `drops_applied` the fewest CacheDrops any
of them had applied (the conservative figure for the response cache's retired ids). Rank 0 then
hears its few children's reports, not the world's.

A training step submits the same operations every time, so once they are cached a rank's round
is a tuple of ids. Each id is held here until this rank and every child's whole subtree have
sent it, in whatever frames and order, and then goes up with the others complete at the same
time, as one report (a sender's ids chosen before it applied a CacheDrop go up before any it
chose after) (Horovod ANDs a bit per cached operation over the ranks, to the same end).
Anything else (requests, a join, a stop, another process set's id, a report that is not a
subtree's) goes up at once, after whatever was held, so each rank's reports keep their order.
Ids held longer than `hold_s` go up as they are, so that rank 0's stall inspector sees who is
late, and so does each late sender's id when it comes (it is not held again for senders that
have sent theirs). While a rank below has joined (and no JoinDone has come down), nothing is
held: the joined rank sends nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from hora.collectives._messages import Join, JoinDone

# How long a cached operation is held for the rest of its subtree before it goes up as it is,
# by default: the stall inspector's resolution (`StallSettings.resolution_s`), which the loop
# passes; rank 0 counts one as long before it matches its ranks one by one. Nothing waits on a
# held id meanwhile (it cannot run before the late rank's comes), so it is not short.
HOLD_S = 1.0

Report = tuple[int, bool, int, Any]  # (rank, whole subtree, drops applied, items)
_HELD, _COMPLETE, _PASSED = "held", "complete", "passed"


class Relay:
    """What this rank sends up next (`out`), and the ids of its subtree it holds."""

    def __init__(
        self,
        rank: int,
        children: Collection[int],
        is_global: Callable[[int], bool],
        hold_s: float = HOLD_S,
    ) -> None:
        self.rank = rank
        self.hold_s = hold_s
        self._senders = frozenset((rank, *children))  # this rank and each child
        self._is_global = is_global  # whether a cache id is a request of the global set
        self._held: dict[int, list[int]] = {}  # id -> the senders that sent it, in order
        # sender -> the drops its held ids were chosen at (all alike: see `_hold`)
        self._drops: dict[int, int] = {}
        self._since = 0.0
        # Ids sent up before every sender had them: who still owes each.
        self._late: dict[int, set[int]] = {}
        self._joined = 0  # ranks below that joined while no JoinDone came down
        self.out: list[Report] = []

    def own(self, drops_applied: int, items: list[Any], now: float) -> None:
        """This rank's round, its requests already encoded as cache ids where known."""
        if items and all(type(i) is int and self._is_global(i) for i in items):
            self._hold(self.rank, False, drops_applied, items, now)
        else:
            self._pass((self.rank, False, drops_applied, items))

    def child(self, child: int, report: Report, now: float) -> None:
        """A report from (or relayed by) `child`."""
        if report[1] and report[0] == child:
            self._hold(child, True, report[2], report[3], now)
        else:
            self._pass(report)

    def heard(self, responses: list[Any]) -> None:
        """Rank 0's answer, on its way down: a JoinDone ends the joins below."""
        if self._joined and any(type(r) is JoinDone for r in responses):
            self._joined = 0

    def holding(self) -> bool:
        return bool(self._held)

    def due(self) -> float | None:
        """When what is held goes up as it is (None: nothing is held)."""
        return self._since + self.hold_s if self._held else None

    def release(self, now: float) -> None:
        """Send up what was held past `hold_s`."""
        if self._held and now >= self._since + self.hold_s:
            self.flush()

    def flush(self) -> None:
        """Send up what is held, each sender's ids as one report; the senders that owe them
        send theirs up as they come."""
        if not self._held:
            return
        by_sender: dict[int, list[int]] = {}
        for cid, senders in self._held.items():
            for sender in senders:
                by_sender.setdefault(sender, []).append(cid)
            self._late[cid] = set(self._senders.difference(senders))
        self._held = {}
        for sender, ids in by_sender.items():
            self.out.append((sender, sender != self.rank, self._drops[sender], tuple(ids)))
        self._drops = {}

    def take(self) -> list[Report]:
        out, self.out = self.out, []
        return out

    def _hold(self, sender: int, whole: bool, drops: int, ids: Any, now: float) -> None:
        if self._joined:
            self._pass((sender, whole, drops, ids))
            return
        if self._drops.get(sender, drops) != drops:
            # Its earlier ids go up first: rank 0 forgets a dropped id once every rank has said
            # it applied the drop, so no id may reach it after a later word of the same sender.
            self.flush()
        if not self._held:
            self._since = now
        self._drops[sender] = drops
        complete: list[int] = []
        passed: list[int] = []
        for cid in ids:
            went = self._count(cid, sender)
            if went is _PASSED:
                passed.append(cid)
            elif went is _COMPLETE:
                complete.append(cid)
        if passed:
            self.out.append((sender, whole, drops, tuple(passed)))
        if complete:
            self.out.append((self.rank, True, min(self._drops.values()), tuple(complete)))

    def _count(self, cid: int, sender: int) -> str:
        """Where `sender`'s id goes: held, complete (every sender has it), or passed up as it
        is (its share of an id sent up already, or a second one before it ran: rank 0 then
        matches it by name)."""
        late = self._late
        owed = late.get(cid)
        if owed is not None and sender in owed:
            owed.discard(sender)
            if not owed:
                del late[cid]
            return _PASSED
        held = self._held
        senders = held.get(cid)
        if senders is None:
            held[cid] = senders = [sender]
        elif sender in senders:
            return _PASSED
        else:
            senders.append(sender)
        if len(senders) < len(self._senders):
            return _HELD
        del held[cid]
        return _COMPLETE

    def _pass(self, report: Report) -> None:
        self.flush()
        if not report[1] and any(type(i) is Join for i in report[3]):
            self._joined += 1
        self.out.append(report)
