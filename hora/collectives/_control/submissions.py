"""What callers submitted and the loop has yet to finish (Horovod's `tensor_queue.cc`).

A caller's thread only records an operation here (`SubmissionQueue.push`); the loop's rounds
take the queue, and complete each `Op` once its bucket ran. Submissions gather for a cycle or
more (HOROVOD_CYCLE_TIME, `GATHER_CYCLES`) before the loop takes them, so that a caller issuing
many operations is not interrupted by the loop thread for each one (every hand-over of the GIL
costs both threads), and they travel and fuse together; a caller that blocks asks for a `flush`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from hora.collectives._common import HorovodInternalError
from hora.collectives._data.local_op import LocalOp
from hora.collectives._messages import JOIN, Entry, ProcessSetChange, Request

# Gathering ends a cycle after the latest submission, so that a caller still issuing a batch is
# not cut off mid-way (every extra bucket costs both ranks a round of negotiation and a barrier),
# but at most this many cycles after the first one: a caller that never blocks is still served.
GATHER_CYCLES = 5


class Op:
    """One submitted operation, from `submit` to `synchronize`.

    No `threading.Event` per operation (creating and setting one cost ~3 us + ~2 us, 200 small
    tensors per step pay it 200 times): `done` is a plain flag, and a waiter creates `event`
    only when it must block. A completer sets `done` before reading `event` (`complete`, or
    inline where a bucket's operations complete together, `responses`); the waiter publishes
    `event` before re-reading `done`, so one of them always sees the other.
    """

    __slots__ = ("done", "error", "event", "finish", "local", "request", "result")

    def __init__(self, request: Request | None, local: LocalOp, finish: Callable[[list[Any]], Any]):
        self.request = request  # None for join
        self.local = local
        self.finish = finish
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False
        self.event: threading.Event | None = None

    def complete(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done = True
        event = self.event
        if event is not None:
            event.set()

    def wait(self) -> None:
        if self.done:
            return
        with _WAITERS_LOCK:
            if self.event is None:
                self.event = threading.Event()
            event = self.event
        if not self.done:
            event.wait()


_WAITERS_LOCK = threading.Lock()


class SubmissionQueue:
    """The submissions not taken yet and the operations in flight, under one lock.

    The flags below are read without the lock where a stale value costs only a later wake-up."""

    def __init__(self, cycle_time_s: float) -> None:
        self.cycle_time_s = cycle_time_s
        self.lock = threading.Lock()
        self.items: list[Any] = []  # Request, JOIN, STOP or ProcessSetChange, in order
        self.inflight: dict[tuple[int, str], Op] = {}
        self.join_op: Op | None = None
        self.error: str | None = None  # why the loop ended, once it has
        # True while the loop thread sleeps with nothing queued: only then does a submission
        # pay for a wake-up (a syscall and a GIL hand-over); a busy thread re-reads the queue.
        self.idle = False
        # When the queue last went from empty to not empty, and the latest submission.
        self.queued_since = 0.0
        self.last_queued = 0.0
        # Set by a caller that blocks on an operation: the loop takes and sends what is queued
        # now instead of waiting out the cycle, since that caller will submit nothing more until
        # it returns.
        self.flush = False
        # True while a worker's loop holds taken requests it has not sent yet: with an empty
        # queue as well, a blocking caller has nothing to flush and need not wake the thread.
        self.holding = False

    # ----- callers' side -------------------------------------------------------------------------
    def push(self, op: Op, flush: bool) -> bool:
        """Queue `op`; True when the loop thread must be woken for it. A duplicate in-flight
        name raises ValueError; an ended loop, HorovodInternalError."""
        with self.lock:
            if self.error is not None:
                raise HorovodInternalError(self.error)
            request = op.request
            if request is None:
                self._push_join(op)
            else:
                key = (request.process_set_id, request.name)
                if key in self.inflight:
                    raise ValueError(
                        f"An operation named '{request.name}' is already in flight; names of "
                        "pending operations must be unique."
                    )
                self.inflight[key] = op
                self.last_queued = now = time.monotonic()
                if not self.items:
                    self.queued_since = now
                self.items.append(request)
            wake, self.idle = self.idle, False
            if flush and not self.flush:
                self.flush = wake = True
        return wake

    def _push_join(self, op: Op) -> None:
        if self.join_op is not None:
            raise ValueError("join() is already in progress")
        self.join_op = op
        self.items.append(JOIN)

    def push_control(self, item: ProcessSetChange | Any, flush: bool = False) -> None:
        """Queue a control message (process-set changes, STOP) in order with the submissions."""
        with self.lock:
            self.items.append(item)
            self.idle = False
            if flush:
                self.flush = True

    # ----- the loop's side ---------------------------------------------------------------------
    def due_at(self, first: float) -> float:
        """When gathering that began at `first` ends (see GATHER_CYCLES)."""
        cycle = self.cycle_time_s
        return min(first + GATHER_CYCLES * cycle, max(first, self.last_queued) + cycle)

    def take(self) -> list[Any]:
        """A worker's take: everything submitted (it decides itself when to send)."""
        with self.lock:
            items, self.items = self.items, []
            self.idle = False
            if items:
                self.holding = True  # under the lock: a blocking caller sees queue or this
        return items

    def take_due(self) -> list[Any]:
        """Rank 0's take: what was submitted, once it is due (see `gather_time`)."""
        with self.lock:
            if not self.items:
                return []
            if not self.flush and time.monotonic() < self.due_at(self.queued_since):
                return []
            self.flush = False  # rank 0 takes all it holds at once: a flush is served
            items, self.items = self.items, []
        return items

    def gather_time(self) -> float | None:
        """How long the queue may still gather before the loop takes it: 0.0 once a caller
        blocks (flush) or the gathering is due (`due_at`); None when nothing is queued
        (the thread is then idle: the next submission wakes it)."""
        with self.lock:
            if not self.items:
                self.idle = True
                return None
            if self.flush:
                return 0.0
            return max(0.0, self.due_at(self.queued_since) - time.monotonic())

    def mark_idle(self) -> bool:
        """Declare the thread about to sleep; False (and stay awake) if work arrived meanwhile."""
        with self.lock:
            if self.items:
                return False
            self.idle = True
            return True

    def pop_bucket(self, process_set_id: int, entries: list[Entry]) -> list[Op | None]:
        """This rank's operations of a bucket, in order (None where it submitted none: joined)."""
        inflight = self.inflight
        with self.lock:
            return [inflight.pop((process_set_id, e.name), None) for e in entries]

    def pop(self, process_set_id: int, name: str) -> Op | None:
        with self.lock:
            return self.inflight.pop((process_set_id, name), None)

    def pop_join(self) -> Op | None:
        with self.lock:
            op, self.join_op = self.join_op, None
        return op

    def describe(self) -> list[str]:
        """What this rank waits for, as a person reads it ("allreduce 'grad.w'"), oldest first."""
        with self.lock:
            requests = [op.request for op in self.inflight.values() if op.request is not None]
            joining = self.join_op is not None
        described = []
        for req in requests:
            where = f" (process set {req.process_set_id})" if req.process_set_id else ""
            described.append(f"{req.kind} {req.name!r}{where}")
        return described + (["join"] if joining else [])

    def fail_all(self, reason: str) -> None:
        """End the loop: every operation in flight, and every later submission, fails."""
        with self.lock:
            if self.error is None:
                self.error = reason
            ops = list(self.inflight.values())
            self.inflight.clear()
            if self.join_op is not None:
                ops.append(self.join_op)
                self.join_op = None
        for op in ops:
            if not op.done:
                op.complete(error=HorovodInternalError(reason))
