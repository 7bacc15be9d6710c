"""A worker's round (every rank but 0): pass rank 0's decisions down and apply them, pass its
children's reports up with its own (`relay`).

Requests gather until the gathering cycle ends or a caller blocks on one (`SubmissionQueue`),
then go up to this rank's parent in the negotiation tree (`tree`), each request rank 0 already
knows as its response-cache id (`WorkerCache.encode`). Rank 0's answer comes down as one frame,
which is forwarded to the children before it is read here, then applied in order
(`ResponseHandler`) once its cache ids are expanded. In a world of 9 ranks or fewer every
worker is a child of rank 0 and has none of its own: the star it always was.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import time
from typing import Any

from hora.collectives._common import SHUT_DOWN
from hora.collectives._control import channel
from hora.collectives._control.cache import WorkerCache
from hora.collectives._control.relay import HOLD_S, Relay
from hora.collectives._control.responses import ResponseHandler
from hora.collectives._control.submissions import SubmissionQueue
from hora.collectives._data.groups import GroupInfo
from hora.collectives._messages import Bucket, CacheDrop, ProcessSetChange, Request, Shutdown, Stop
from hora.timeline import hooks as _th

STOPPING_WAKE_S = 0.5  # how often a stopping worker checks that rank 0 has acknowledged it
PARENT = -1  # the selector key's data for the parent's socket (a child's is its rank)


class WorkerRound:
    """A worker's side of the negotiation tree: its sockets to its parent and children, the
    relay of its subtree's reports, and its half of the response cache."""

    def __init__(
        self,
        rank: int,
        parent: tuple[int, socket.socket],
        children: dict[int, socket.socket],
        sel: selectors.BaseSelector,
        queue: SubmissionQueue,
        handler: ResponseHandler,
        process_sets: dict[int, GroupInfo],
        timeout_s: float,
        hold_s: float = HOLD_S,
    ) -> None:
        self.rank = rank
        self._parent_rank, self._parent = parent
        sel.register(self._parent, selectors.EVENT_READ, PARENT)
        for child, sock in children.items():
            sel.register(sock, selectors.EVENT_READ, child)
        self._children = children
        self._sel = sel
        self._queue = queue
        self._handler = handler
        self._process_sets = process_sets
        self._timeout_s = timeout_s
        self.cache = WorkerCache()
        self.relay = Relay(rank, tuple(children), self._is_global, hold_s)
        self.ended = False  # rank 0 stopped every rank
        # Requests taken but not sent yet, since when, whether a STOP is among them, and when
        # this rank asked rank 0 to shut down.
        self._unsent: list[Any] = []
        self._first_unsent = 0.0
        self._stop_unsent = False
        self._stopping_since: float | None = None

    def step(self, ready: list[selectors.SelectorKey]) -> float | None:
        """One round: pass on and apply rank 0's answer, take the children's reports, then send
        what is due; returns how long the loop may sleep (None: until something arrives)."""
        now = time.monotonic()
        for key in ready:
            if key.data == PARENT:
                self._receive()
                if self.ended:
                    return None
            else:
                self._receive_child(key, now)
        queue = self._queue
        flush, queue.flush = queue.flush, False  # read before the queue: none is missed
        self._take(now)
        if self._unsent and (flush or self._stop_unsent or now >= queue.due_at(self._first_unsent)):
            self._send(now)
        self.relay.release(now)
        self._send_up()
        return self._sleep_time(now)

    def has_work(self) -> bool:
        """Requests taken and not sent yet, or a subtree's round held."""
        return bool(self._unsent) or self.relay.holding()

    def tell_peers(self, reason: str) -> None:
        """This rank's loop failed: its subtree stops with `reason` at once, and rank 0 stops
        every other rank with it (no orderly STOP)."""
        down = channel.pack([Shutdown(reason)])
        for sock in self._children.values():
            with contextlib.suppress(OSError):
                channel.send_payload(sock, down)
        self.relay.flush()
        up = [*self.relay.take(), (self.rank, False, self.cache.drops_applied, [Shutdown(reason)])]
        channel.send_msg(self._parent, up)

    def close(self) -> None:
        self._parent.close()
        for sock in self._children.values():
            sock.close()

    def _receive(self) -> None:
        """Rank 0's answer: the same bytes to every child first, then applied here."""
        try:
            payload = channel.recv_payload(self._parent)
        except (ConnectionError, OSError) as exc:
            whose = (
                "rank 0 (coordinator)"
                if self._parent_rank == 0
                else (f"rank {self._parent_rank}, its parent in the negotiation tree")
            )
            raise ConnectionError(f"lost the connection to {whose}") from exc
        for child, sock in list(self._children.items()):
            try:
                channel.send_payload(sock, payload)
            except OSError:
                self._lost(child)
        responses = channel.loads(payload)
        self.relay.heard(responses)
        self._update_cache(responses)
        if self._handler.handle(responses):
            self.ended = True

    def _receive_child(self, key: selectors.SelectorKey, now: float) -> None:
        child = key.data
        try:
            reports = channel.recv_msg(key.fileobj)  # type: ignore[arg-type]
        except (ConnectionError, OSError):
            self._lost(child)
            return
        relay = self.relay
        for report in reports:
            relay.child(child, report, now)

    def _lost(self, child: int) -> None:
        """A child's socket closed: rank 0 hears of it and stops every rank."""
        sock = self._children.pop(child, None)
        if sock is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(sock)
        sock.close()
        reason = Shutdown(f"{SHUT_DOWN} (rank {child} disconnected)")
        self.relay.own(self.cache.drops_applied, [reason], time.monotonic())

    def _is_global(self, cache_id: int) -> bool:
        req = self.cache.requests.get(cache_id)
        return req is not None and req.process_set_id == 0

    def _update_cache(self, responses: list[Any]) -> None:
        """Expand the hits and learn the ids of every bucket first, as running them reads their
        entries; then apply the drops (a CacheDrop only ever comes after the buckets)."""
        cache = self.cache
        for resp in responses:
            kind = type(resp)
            if kind is Bucket:
                info = self._process_sets.get(resp.process_set_id)
                cache.learn(resp, info.ranks if info is not None else ())
            elif kind is CacheDrop:
                cache.forget(resp)

    def _take(self, now: float) -> None:
        unsent = self._unsent
        for item in self._queue.take():
            kind = type(item)
            if kind is not Request:
                if kind is ProcessSetChange:
                    continue  # rank 0's coordinator alone keeps the sets
                if kind is Stop:
                    self._stop_unsent = True
            if not unsent:
                self._first_unsent = now
            unsent.append(item)

    def _send(self, now: float) -> None:
        if _th.recorder.enabled:
            _th.recorder.cycle()  # a negotiation round starts (CYCLE_START)
        cache = self.cache
        self.relay.own(cache.drops_applied, cache.encode(self._unsent), now)
        if self._stop_unsent:
            self._stopping_since = now
            self._stop_unsent = False
        self._unsent = []
        self._queue.holding = False

    def _send_up(self) -> None:
        reports = self.relay.take()
        if reports:
            channel.send_msg(self._parent, reports)

    def _sleep_time(self, now: float) -> float | None:
        wait: float | None = None
        if self._stopping_since is not None:
            if now - self._stopping_since > self._timeout_s:
                raise ConnectionError("the coordinator did not acknowledge shutdown")
            wait = STOPPING_WAKE_S
        elif self._unsent:
            wait = max(0.0, self._queue.due_at(self._first_unsent) - now)
        held = self.relay.due()
        if held is not None:
            wait = max(0.0, held - now) if wait is None else min(wait, max(0.0, held - now))
        if wait is not None:
            return wait
        return None if self._queue.mark_idle() else 0.0
