"""Rank 0's round: take its children's reports (each for a rank, or for a whole subtree of the
negotiation tree: `tree`, `relay`) and its own submissions once due, let the `Coordinator`
decide, send the decisions down the tree in one pickled payload and apply them here too
(Horovod's controller on its coordinator).

Rank 0 also decides when every rank stops: a rank's `shutdown()` (STOP), a failed or lost rank,
or the stall inspector's verdict; the reason travels to all as the last response.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import time
from collections.abc import Sequence
from typing import Any

from hora.collectives._common import SHUT_DOWN
from hora.collectives._control import channel
from hora.collectives._control.negotiation import Coordinator
from hora.collectives._control.responses import ResponseHandler
from hora.collectives._control.stall import StallInspector
from hora.collectives._control.submissions import SubmissionQueue
from hora.collectives._messages import Join, ProcessSetChange, Request, Shutdown, Stop
from hora.timeline import hooks as _th


class CoordinatorRound:
    """Rank 0's side of the negotiation tree: a socket per child, the coordinator, the stall
    inspector, and why every rank must stop (None while all is well)."""

    def __init__(
        self,
        peers: dict[int, socket.socket],
        sel: selectors.BaseSelector,
        queue: SubmissionQueue,
        handler: ResponseHandler,
        coordinator: Coordinator,
        stall: StallInspector,
    ) -> None:
        for rank, peer in peers.items():
            sel.register(peer, selectors.EVENT_READ, rank)
        self._peers = peers
        self._sel = sel
        self._queue = queue
        self._handler = handler
        self.coordinator = coordinator
        self._stall = stall
        self._shutdown: str | None = None
        self.ended = False  # every rank was told to stop
        self.reports_heard = 0  # reports from the children, each a rank's or a subtree's
        # How long a cached operation is counted waiting for the other ranks' ids before they
        # are matched one by one, where the stall inspector sees who is missing: as long as a
        # rank of the tree holds one for its subtree (`relay`).
        self._hold_s = stall.settings.resolution_s

    def step(self, ready: list[selectors.SelectorKey]) -> float | None:
        """One round: take the children's frames that are `ready` and this rank's submissions once
        due, plan, send the responses and run them; returns how long the loop may sleep (None:
        until something arrives)."""
        if _th.recorder.enabled:
            _th.recorder.cycle()  # a negotiation round starts (CYCLE_START)
        for key in ready:
            self._receive(key)
        self._submit_own()
        self._respond()
        return None if self.ended else self._sleep_time()

    def has_work(self) -> bool:
        """Operations some rank still owes, or rounds set aside."""
        return self.coordinator.has_pending() or self.coordinator.has_set_aside()

    def tell_peers(self, reason: str) -> None:
        """This rank's loop failed: every rank stops with `reason` (the children pass it on)."""
        payload = channel.pack([Shutdown(reason)])
        for peer in self._peers.values():
            with contextlib.suppress(OSError):  # a lost child's subtree stops on its own
                channel.send_payload(peer, payload)

    def close(self) -> None:
        for peer in self._peers.values():
            peer.close()

    def _stop(self, reason: str) -> None:
        if self._shutdown is None:
            self._shutdown = reason

    def _receive(self, key: selectors.SelectorKey) -> None:
        """One child's frame: its reports, each `(rank, whole, drops_applied, items)`, see
        `relay`."""
        child = key.data
        try:
            reports = channel.recv_msg(key.fileobj)  # type: ignore[arg-type]
        except (ConnectionError, OSError):
            self._sel.unregister(key.fileobj)
            self._peers.pop(child, None)
            self._stop(f"{SHUT_DOWN} (rank {child} disconnected)")
            return
        coord = self.coordinator
        now = time.monotonic()
        self.reports_heard += len(reports)
        for rank, whole, drops_applied, items in reports:
            if whole or _ids_only(items):
                coord.receive_ids(rank, items, now, whole)
            else:
                self._submit(rank, items)
            coord.ack(rank, drops_applied, whole)

    def _submit_own(self) -> None:
        own = self._queue.take_due()
        if not own:
            return
        coord = self.coordinator
        ids = coord.cache.own_ids(own)
        if ids is not None:
            coord.receive_ids(0, ids, time.monotonic())
            return
        self._submit(0, own)

    def _submit(self, rank: int, items: Sequence[Any]) -> None:
        coord = self.coordinator
        for item in items:
            kind = type(item)
            if kind is int:
                coord.submit_cached(rank, item)
            elif kind is Request:
                coord.submit(rank, item)
            elif kind is Join:
                coord.join(rank)
            elif kind is Stop:
                self._stop(SHUT_DOWN)
            elif kind is Shutdown:  # that rank's loop failed
                self._stop(item.reason)
            elif kind is ProcessSetChange:  # only ever this rank's own
                coord.set_process_set(item.process_set_id, item.ranks)

    def _respond(self) -> None:
        coord = self.coordinator
        age = coord.stash_age(time.monotonic())
        if age is not None and age >= self._hold_s:
            coord.spill()  # a rank is late: let the stall inspector see who
        responses: list[Any] = coord.take()
        if self._shutdown is None:
            self._shutdown = self._stall.inspect(bool(responses))
        if self._shutdown is not None:
            responses.append(Shutdown(self._shutdown))
        if not responses:
            return
        payload = channel.pack(responses)
        for peer in list(self._peers.values()):
            try:
                channel.send_payload(peer, payload)
            except OSError:
                self._stop(SHUT_DOWN)
        if self._handler.handle(responses):
            self.ended = True

    def _sleep_time(self) -> float | None:
        wait = self._stall.wake_in()
        gather = self._queue.gather_time()
        if gather is not None:
            wait = gather if wait is None else min(wait, gather)
        age = self.coordinator.stash_age(time.monotonic())
        if age is not None:
            left = max(0.0, self._hold_s - age)
            wait = left if wait is None else min(wait, left)
        return wait


def _ids_only(items: Sequence[Any]) -> bool:
    """A round of response-cache ids alone (a repeated one: `Coordinator.receive_ids`)."""
    return bool(items) and all(type(i) is int for i in items)
