"""The collective loop (`CollectiveLoop`): one thread per process that negotiates and runs every
collective (Horovod's `operations.cc`), and the handles callers wait on.

The caller's thread only records an operation (`SubmissionQueue.push`) and wakes the loop when
it sleeps (`submit` returns a handle at once). Each round of the loop is this rank's side of
the negotiation (`WorkerRound` or, on rank 0, `CoordinatorRound`): requests go up the
negotiation tree to rank 0, the agreed buckets come back down, run on the data path and
complete the handles. No rank polls while
idle: the threads sleep in `select` until a submission or a message arrives.

Whoever holds the drive lock runs the loop's rounds (`_guarded_step`): the background thread,
or a caller blocked in `synchronize`, which then sends, negotiates and runs the data path itself
instead of handing the work to the thread and waiting to be woken (two thread hand-overs per
blocking call saved, the thread's GIL requests along with them). The thread keeps everything
moving while no caller waits: operations of hooks during a backward pass, `poll` loops.

Any error in a round ends the loop on every rank: pending and later operations raise
HorovodInternalError, and the other ranks are told at once rather than at their transport's timeout.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import selectors
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hora.collectives._common import SHUT_DOWN
from hora.collectives._control import channel
from hora.collectives._control.cache import capacity_from_env
from hora.collectives._control.coordinator_round import CoordinatorRound
from hora.collectives._control.negotiation import Coordinator
from hora.collectives._control.responses import ResponseHandler
from hora.collectives._control.stall import StallInspector, StallSettings, log_stall
from hora.collectives._control.submissions import Op, SubmissionQueue
from hora.collectives._control.tree import NegotiationTree
from hora.collectives._control.worker_round import WorkerRound
from hora.collectives._data.groups import GroupInfo
from hora.collectives._messages import STOP, ProcessSetChange
from hora.timeline import hooks as _th

log = logging.getLogger("hora.torch")


@dataclass
class LoopConfig:
    rank: int
    size: int
    cycle_time_s: float
    fusion_threshold: int
    timeout_s: float
    stall: StallSettings
    #: where rank 0's stall warnings go (the collectives' hook gives the driver's)
    report_stall: Callable[[str | None], None] = log_stall


def _sleeper_for(sel: selectors.BaseSelector) -> selectors.BaseSelector:
    """What the thread sleeps on: a selector watching `sel`'s own descriptor (epoll and kqueue
    nest), so that a driving caller can take `sel` out of it and the thread sleeps through the
    messages that caller is waiting for, instead of waking for each one and queueing for the
    GIL and the drive lock. Selectors without a descriptor are watched directly."""
    try:
        fd = sel.fileno()  # type: ignore[attr-defined]
        sleeper = selectors.DefaultSelector()
        sleeper.register(fd, selectors.EVENT_READ)
    except (AttributeError, OSError, ValueError):
        return sel
    return sleeper


@dataclass
class TreeSockets:
    """This rank's place in the negotiation tree: the tree, its parent (rank and socket; None
    on rank 0) and its children's sockets by rank."""

    tree: NegotiationTree
    parent: tuple[int, socket.socket] | None
    children: dict[int, socket.socket]


def _negotiation(
    config: LoopConfig,
    process_sets: dict[int, GroupInfo],
    sel: selectors.BaseSelector,
    queue: SubmissionQueue,
    sockets: TreeSockets,
) -> WorkerRound | CoordinatorRound:
    """This rank's side of the negotiation tree: rank 0 coordinates, every other rank works."""
    handler = ResponseHandler(queue, process_sets)
    if config.rank != 0:
        assert sockets.parent is not None
        return WorkerRound(
            config.rank,
            sockets.parent,
            sockets.children,
            sel,
            queue,
            handler,
            process_sets,
            config.timeout_s,
            config.stall.resolution_s,
        )
    coordinator = Coordinator(
        config.size, config.fusion_threshold, capacity_from_env(), sockets.tree
    )
    for ps_id, info in process_sets.items():
        coordinator.set_process_set(ps_id, info.ranks)
    stall = StallInspector(config.stall, coordinator, config.report_stall)
    return CoordinatorRound(sockets.children, sel, queue, handler, coordinator, stall)


class CollectiveLoop:
    """Owns the handles, the submission queue, this rank's negotiation and the thread."""

    def __init__(
        self,
        config: LoopConfig,
        process_sets: dict[int, GroupInfo],
        sockets: TreeSockets,
    ) -> None:
        self.config = config
        self.queue = SubmissionQueue(config.cycle_time_s)
        self._handles: dict[int, Op] = {}
        self._handle_ids = itertools.count()
        self._counters: dict[tuple[str, int], int] = {}
        self._wake_r, self._wake_w = channel.wake_pair()
        # The loop's rounds run under this lock, in the thread or in a blocked caller (see the
        # module's docstring); `_caller_drives` says which, `_running` ends them for good.
        self._drive = threading.Lock()
        self._caller_drives = False
        self.rounds = 0  # rounds run so far, by anyone (tests read it: an idle loop sleeps)
        self._running = True
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self.negotiation = _negotiation(config, process_sets, self._sel, self.queue, sockets)
        self._sleeper = _sleeper_for(self._sel)
        self._single_threaded = threading.Event()
        threads = torch.get_num_threads()
        self._thread = threading.Thread(target=self._main, name="hora-collective-loop", daemon=True)
        self._thread.start()
        # torch's setting is global as well as per thread: give it back to every other thread.
        self._single_threaded.wait(10.0)
        torch.set_num_threads(threads)

    # ----- caller's thread -------------------------------------------------------------------
    def generated_name(self, kind: str, process_set_id: int) -> str:
        """Name an unnamed op; counted per kind and process set, so that ranks agree as long as
        they submit the same unnamed ops of a set in the same order (Horovod's contract)."""
        key = (kind, process_set_id)
        with self.queue.lock:
            n = self._counters.get(key, 0)
            self._counters[key] = n + 1
        return f"{kind}.noname.{n}"

    def submit(self, op: Op, flush: bool = False) -> int:
        """Queue `op` and return its handle; a duplicate in-flight name raises ValueError.

        `flush`: the caller will wait for it next, so send it (and what is queued) at once
        rather than at the end of the gathering cycle (one wake-up of the loop, not two)."""
        wake = self.queue.push(op, flush)
        handle = next(self._handle_ids)
        self._handles[handle] = op
        request = op.request
        if request is not None:
            rec = _th.recorder
            if rec.enabled:
                rec.begin(request.name, "NEGOTIATE_" + request.kind.upper())
        if wake:
            self._wake()
        return handle

    def control(self, change: ProcessSetChange) -> None:
        """Queue a process-set change in order with the submissions."""
        self.queue.push_control(change)
        self._wake()

    def poll(self, handle: int) -> bool:
        op = self._handles.get(handle)
        if op is None:
            raise ValueError(f"Handle {handle} was not created or has been cleared.")
        return op.done

    def synchronize(self, handle: int) -> Any:
        op = self._handles.get(handle)
        if op is None:
            raise ValueError(f"Handle {handle} was not created or has been cleared.")
        if not op.done:
            self._wait(op)
        del self._handles[handle]
        if op.error is not None:
            raise op.error
        return op.result

    def _wait(self, op: Op) -> None:
        """Drive the loop until `op` is done, or wait for whoever drives it now.

        The thread holds the drive lock only for a round (never while it sleeps), so a caller
        waits for that round to end; another caller may hold it while it waits for its own
        operation, so then this one is woken by the operation's event instead, as it does not
        know when that caller will let go (and may need this one's next submission first)."""
        while not op.done:
            got = self._drive.acquire(blocking=False)
            if not got and not self._caller_drives:
                got = self._drive.acquire(timeout=0.05)
            if got:
                try:
                    self._drive_until(op)
                finally:
                    self._drive.release()
                    self._after_drive()
                return
            if self._caller_drives:
                queue = self.queue
                if not queue.flush and (queue.items or queue.holding):
                    queue.flush = True
                    self._wake()
                op.wait()
                return

    def _drive_until(self, op: Op) -> None:
        """Run the loop's rounds in this (caller's) thread until `op` is done."""
        if not self._running:
            op.wait()  # the loop has ended: `fail_all` completes every operation
            return
        self._caller_drives = True
        self.queue.flush = True  # this caller submits nothing until it returns: send the queue
        if self._sleeper is not self._sel:
            self._sleeper.unregister(self._sel.fileno())  # no wake-ups for the thread meanwhile
        try:
            with torch.no_grad():  # the data path writes into tensors that may require grad
                wait: float | None = 0.0
                while not op.done and self._running:
                    wait = self._guarded_step(wait)
        except BaseException as exc:  # e.g. KeyboardInterrupt mid-message: the channel is lost
            if self._running:
                self._crash(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._caller_drives = False
            if self._sleeper is not self._sel:
                self._sleeper.register(self._sel.fileno(), selectors.EVENT_READ)

    def _after_drive(self) -> None:
        """Hand the loop back to the thread: wake it if something is left to move (its
        sleep was computed before this caller's rounds) or if the loop has ended."""
        queue = self.queue
        if (
            not self._running
            or queue.items
            or queue.inflight
            or queue.join_op is not None
            or self.negotiation.has_work()
        ):
            self._wake()

    def stop(self, timeout: float = 10.0) -> None:
        """Tell every rank we are shutting down and wait (bounded) for the thread to finish."""
        if self._thread.is_alive():
            self.queue.push_control(STOP, flush=True)
            self._wake()
            self._thread.join(timeout)
        self.queue.fail_all(SHUT_DOWN)
        if not self._thread.is_alive():
            if self._sleeper is not self._sel:
                self._sleeper.close()
            self._sel.close()
        self.negotiation.close()
        self._wake_r.close()
        self._wake_w.close()

    @property
    def failed(self) -> str | None:
        return self.queue.error

    @property
    def broken(self) -> bool:
        """Stopped by a failure (an error on some rank's loop, a lost peer), not by a rank's
        `shutdown()`: every rank's loop stopped with it, so every rank may start anew."""
        error = self.queue.error
        return error is not None and error != SHUT_DOWN

    def _wake(self) -> None:
        try:  # noqa: SIM105 - a hot path: suppress() costs a context manager per call
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full, so a wake-up is pending anyway

    # ----- the loop's thread -----------------------------------------------------------------
    def _main(self) -> None:
        torch.set_grad_enabled(False)  # the loop moves data; autograd lives in the caller
        # One intra-op thread: with OpenMP, a thread's parallel ops get a team of their own, whose
        # workers would compete with the training thread's team for the cores; the loop's
        # copies and sums are small (Horovod's background thread is single-threaded too).
        torch.set_num_threads(1)
        self._single_threaded.set()
        wait: float | None = 0.0
        while True:
            if wait is None or wait > 0.0:
                self._sleeper.select(wait)  # only to sleep: the round below looks again, locked
            with self._drive:
                if not self._running:
                    return
                try:
                    wait = self._guarded_step(0.0)
                except Exception:  # _crash has failed every operation already
                    return

    def _guarded_step(self, timeout: float | None) -> float | None:
        """One round (the drive lock held), waiting up to `timeout` for a message; any error ends
        the loop on every rank. Returns how long the loop may sleep (None: until woken)."""
        self.rounds += 1
        try:
            wait = self.negotiation.step(self._ready(timeout))
            if self.negotiation.ended:
                self._running = False
        except Exception as exc:
            self._crash(exc)
            raise
        if not self._running:
            self._wake()  # the thread (asleep, or waiting for the lock) sees it and ends
        return wait

    def _ready(self, timeout: float | None) -> list[selectors.SelectorKey]:
        """The negotiation sockets with a message, after up to `timeout`; wake-ups drained."""
        ready = []
        for key, _ in self._sel.select(timeout):
            if key.fileobj is self._wake_r:
                self._drain_wake()
            else:
                ready.append(key)
        return ready

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _crash(self, exc: BaseException) -> None:
        log.debug("hora collective loop stopped", exc_info=True)
        self._running = False
        reason = f"{SHUT_DOWN} ({type(exc).__name__}: {exc})"
        self.queue.fail_all(reason)
        with contextlib.suppress(OSError):  # the other ranks fail now, not at their timeout
            self.negotiation.tell_peers(reason)
        self._wake()
