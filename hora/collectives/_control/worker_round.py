"""A worker's round (every rank but 0): apply what rank 0 decided, then send it what is due.

Requests gather until the gathering cycle ends or a caller blocks on one (`SubmissionQueue`),
then travel to rank 0 in one frame, each request rank 0 already knows as its response-cache id
(`WorkerCache.encode`). Rank 0's answers are applied in order (`ResponseHandler`) once their
cache ids are expanded.
"""

from __future__ import annotations

import selectors
import socket
import time
from typing import Any

from hora.collectives._control import channel
from hora.collectives._control.cache import WorkerCache
from hora.collectives._control.responses import ResponseHandler
from hora.collectives._control.submissions import SubmissionQueue
from hora.collectives._data.groups import GroupInfo
from hora.collectives._messages import Bucket, CacheDrop, ProcessSetChange, Request, Shutdown, Stop
from hora.timeline import hooks as _th

STOPPING_WAKE_S = 0.5  # how often a stopping worker checks that rank 0 has acknowledged it


class WorkerRound:
    """A worker's side of the negotiation star: its socket to rank 0 and its half of the cache."""

    def __init__(
        self,
        sock: socket.socket,
        sel: selectors.BaseSelector,
        queue: SubmissionQueue,
        handler: ResponseHandler,
        process_sets: dict[int, GroupInfo],
        timeout_s: float,
    ) -> None:
        sel.register(sock, selectors.EVENT_READ)
        self._sock = sock
        self._queue = queue
        self._handler = handler
        self._process_sets = process_sets
        self._timeout_s = timeout_s
        self.cache = WorkerCache()
        self.ended = False  # rank 0 stopped every rank
        # Requests taken but not sent yet, since when, whether a STOP is among them, and when
        # this rank asked rank 0 to shut down.
        self._unsent: list[Any] = []
        self._first_unsent = 0.0
        self._stop_unsent = False
        self._stopping_since: float | None = None

    def step(self, ready: list[selectors.SelectorKey]) -> float | None:
        """One round: take rank 0's responses if `ready`, then send what is due; returns how
        long the loop may sleep (None: until something arrives)."""
        if ready:
            self._receive()
            if self.ended:
                return None
        queue = self._queue
        flush, queue.flush = queue.flush, False  # read before the queue: none is missed
        now = time.monotonic()
        self._take(now)
        if self._unsent and (flush or self._stop_unsent or now >= queue.due_at(self._first_unsent)):
            self._send(now)
        return self._sleep_time(now)

    def has_work(self) -> bool:
        """Requests taken and not sent yet."""
        return bool(self._unsent)

    def tell_peers(self, reason: str) -> None:
        """This rank's loop failed: rank 0 stops every rank with `reason` (no orderly STOP)."""
        channel.send_msg(self._sock, (self.cache.drops_applied, [Shutdown(reason)]))

    def close(self) -> None:
        self._sock.close()

    def _receive(self) -> None:
        try:
            responses = channel.recv_msg(self._sock)
        except (ConnectionError, OSError) as exc:
            raise ConnectionError("lost the connection to rank 0 (coordinator)") from exc
        self._update_cache(responses)
        if self._handler.handle(responses):
            self.ended = True

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
        channel.send_msg(self._sock, (cache.drops_applied, cache.encode(self._unsent)))
        if self._stop_unsent:
            self._stopping_since = now
            self._stop_unsent = False
        self._unsent = []
        self._queue.holding = False

    def _sleep_time(self, now: float) -> float | None:
        if self._stopping_since is not None:
            if now - self._stopping_since > self._timeout_s:
                raise ConnectionError("the coordinator did not acknowledge shutdown")
            return STOPPING_WAKE_S
        if self._unsent:
            return max(0.0, self._queue.due_at(self._first_unsent) - now)
        return None if self._queue.mark_idle() else 0.0
