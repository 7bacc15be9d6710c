"""A whole world's negotiation in one process: every rank's real round (`CoordinatorRound` on
rank 0, `WorkerRound` elsewhere) joined along the negotiation tree by socket pairs, stepped by
hand in an order the test chooses. Barriers need no data path, so no transport is involved; a
mismatched allreduce fails validation and never runs either."""

from __future__ import annotations

import random
import selectors
import socket
import time
from collections.abc import Iterable
from typing import Any

from hora.collectives._control.coordinator_round import CoordinatorRound
from hora.collectives._control.negotiation import Coordinator
from hora.collectives._control.relay import HOLD_S
from hora.collectives._control.responses import ResponseHandler
from hora.collectives._control.stall import StallInspector, StallSettings
from hora.collectives._control.submissions import Op, SubmissionQueue
from hora.collectives._control.tree import NegotiationTree
from hora.collectives._control.worker_round import WorkerRound
from hora.collectives._data.groups import GroupInfo
from hora.collectives._data.local_op import LocalOp
from hora.collectives._messages import ALLREDUCE, BARRIER, Request


def barrier(name: str, process_set: int = 0) -> Op:
    return Op(Request(name, BARRIER, process_set, (), (), "cpu", 0), LocalOp([], False), list)


def mismatched(name: str, rank: int) -> Op:
    """An allreduce whose shape differs on every rank: it fails validation, never runs."""
    request = Request(name, ALLREDUCE, 0, ("float32",), ((rank + 1,),), "cpu", 4 * (rank + 1))
    return Op(request, LocalOp([], False), list)


class Rank:
    """One rank: its queue, selector, process sets and round; what its handler ran, in order."""

    def __init__(self, rank: int, sets: dict[int, tuple[int, ...]]) -> None:
        self.rank = rank
        self.queue = SubmissionQueue(cycle_time_s=0.0)  # every submission is due at once
        self.sel = selectors.DefaultSelector()
        self.sets = {
            ps: GroupInfo(ranks=members, index=members.index(rank) if rank in members else -1)
            for ps, members in sets.items()
        }
        self.handler = ResponseHandler(self.queue, self.sets)
        self.ran: list[str] = []  # every response this rank applied, as "kind:name"
        self.round: Any = None
        handle = self.handler.handle

        def recorded(responses: list[Any]) -> bool:
            for resp in responses:
                entries = getattr(resp, "entries", None)
                if entries is not None:
                    self.ran.extend(f"{resp.kind}:{e.name}" for e in entries)
                elif hasattr(resp, "message"):
                    self.ran.append(f"failed:{resp.name}")
            return handle(responses)

        self.handler.handle = recorded  # type: ignore[method-assign]

    def step(self, wait: float = 0.0) -> float | None:
        return self.round.step([key for key, _ in self.sel.select(wait)])

    def submit(self, ops: Iterable[Op], flush: bool = True) -> list[Op]:
        ops = list(ops)
        for op in ops:
            self.queue.push(op, flush)
        return ops


class TreeWorld:
    """`size` ranks on a negotiation tree of `fanout`, with process sets `sets` (0 is added)."""

    def __init__(
        self,
        size: int,
        fanout: int,
        sets: dict[int, tuple[int, ...]] | None = None,
        cache_capacity: int = 64,
        hold_s: float = HOLD_S,
    ) -> None:
        sets = {0: tuple(range(size)), **(sets or {})}
        self.tree = NegotiationTree(size, fanout)
        self.ranks = [Rank(r, sets) for r in range(size)]
        up: dict[int, socket.socket] = {}
        down: dict[int, dict[int, socket.socket]] = {r: {} for r in range(size)}
        for child in range(1, size):
            parent = self.tree.parent(child)
            assert parent is not None
            a, b = socket.socketpair()
            down[parent][child], up[child] = a, b
        coordinator = Coordinator(size, 1 << 20, cache_capacity, self.tree)
        for ps, members in sets.items():
            coordinator.set_process_set(ps, members)
        self.coordinator = coordinator
        root = self.ranks[0]
        # A tenth of the check time is how long ids are held (`StallSettings.resolution_s`).
        stall = StallInspector(StallSettings(10 * hold_s, 0.0, False), coordinator)
        root.round = CoordinatorRound(
            down[0], root.sel, root.queue, root.handler, coordinator, stall
        )
        for side in self.ranks[1:]:
            r = side.rank
            parent = self.tree.parent(r)
            assert parent is not None
            side.round = WorkerRound(
                r,
                (parent, up[r]),
                down[r],
                side.sel,
                side.queue,
                side.handler,
                side.sets,
                5.0,
                hold_s,
            )

    def pump(
        self, until: Iterable[Op], rng: random.Random | None = None, seconds: float = 10.0
    ) -> bool:
        """Step the ranks (in `rng`'s order each pass, else by rank) until every op of `until`
        is done (True) or `seconds` have passed (False)."""
        ops = list(until)
        deadline = time.monotonic() + seconds
        while not all(op.done for op in ops):
            if time.monotonic() > deadline:
                return False
            order = list(self.ranks)
            if rng is not None:
                rng.shuffle(order)
            moved = False
            for side in order:
                ready = [key for key, _ in side.sel.select(0)]
                side.round.step(ready)
                moved = moved or bool(ready)
            if not moved:
                time.sleep(0.001)  # a rank may hold a round for its subtree a while
        return True

    def close(self) -> None:
        for side in self.ranks:
            side.round.close()
            side.sel.close()
