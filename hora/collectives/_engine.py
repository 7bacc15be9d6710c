"""The background engine: one thread per process that negotiates and runs every collective.

The caller's thread only records an operation and wakes the engine (`submit` returns a handle at
once). The engine sends requests to the coordinator (rank 0's engine), receives the agreed
buckets, runs them on the data path and completes the handles. No rank polls while idle: the
threads sleep in `select` until a submission or a message arrives.

Whoever holds the drive lock runs the engine's rounds (`_guarded_step`): the background thread,
or a caller blocked in `synchronize`, which then sends, negotiates and runs the data path itself
instead of handing the work to the thread and waiting to be woken (two thread hand-overs per
blocking call saved, the thread's GIL requests along with them). The thread keeps everything
moving while no caller waits: operations of hooks during a backward pass, `poll` loops.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hora.collectives import _channel
from hora.collectives import _timeline_hooks as _th
from hora.collectives._common import SHUT_DOWN, CollectiveRefusedError, HorovodInternalError
from hora.collectives._execute import GroupInfo, LocalOp, run_bucket
from hora.collectives._negotiation import (
    Bucket,
    CacheDrop,
    Coordinator,
    Entry,
    Failure,
    JoinDone,
    Request,
    Response,
    expand,
)
from hora.collectives._stall import StallInspector, StallSettings

log = logging.getLogger("hora.torch")

_JOIN = "J"
_SHUTDOWN = "S"
DEFAULT_CACHE_CAPACITY = 1024
# Gathering ends a cycle after the latest submission, so that a caller still issuing a batch is
# not cut off mid-way (every extra bucket costs both ranks a round of negotiation and a barrier),
# but at most this many cycles after the first one: a caller that never blocks is still served.
GATHER_CYCLES = 5
# How long rank 0 keeps a round of cache ids aside waiting for the other ranks' same round
# (`Coordinator.offer`) before it submits them one by one, where the stall inspector sees them.
STASH_WAIT_S = 0.25


def cache_capacity() -> int:
    """HOROVOD_CACHE_CAPACITY (0 disables the response cache); rank 0's value is the one used."""
    return int(os.environ.get("HOROVOD_CACHE_CAPACITY", DEFAULT_CACHE_CAPACITY))


@dataclass(frozen=True)
class Shutdown:
    """Sent by the coordinator: every engine stops and fails what is pending with `reason`."""

    reason: str


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


class Op:
    """One submitted operation, from `submit` to `synchronize`.

    No `threading.Event` per operation (creating and setting one cost ~3 us + ~2 us, 200 small
    tensors per step pay it 200 times): `done` is a plain flag, and a waiter creates an event
    only when it must block. The completer sets `done` before reading `_event`; the waiter
    publishes `_event` before re-reading `done`, so one of them always sees the other.
    """

    __slots__ = ("_event", "done", "error", "finish", "local", "request", "result")

    def __init__(self, request: Request | None, local: LocalOp, finish: Callable[[list[Any]], Any]):
        self.request = request  # None for join
        self.local = local
        self.finish = finish
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False
        self._event: threading.Event | None = None

    def complete(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done = True
        event = self._event
        if event is not None:
            event.set()

    def wait(self) -> None:
        if self.done:
            return
        with _WAITERS_LOCK:
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        if not self.done:
            event.wait()


_WAITERS_LOCK = threading.Lock()


@dataclass
class EngineConfig:
    rank: int
    size: int
    cycle_time_s: float
    fusion_threshold: int
    timeout_s: float
    stall: StallSettings


class Engine:
    """Owns the negotiation sockets, the in-flight table and the background thread."""

    def __init__(
        self,
        config: EngineConfig,
        process_sets: dict[int, GroupInfo],
        coordinator_peers: dict[int, socket.socket] | None,
        worker_socket: socket.socket | None,
    ) -> None:
        self.config = config
        self.process_sets = process_sets
        self._peers = coordinator_peers or {}
        self._sock = worker_socket
        self._coordinator = (
            Coordinator(config.size, config.fusion_threshold, cache_capacity())
            if config.rank == 0
            else None
        )
        # A worker's copy of the response cache: agreed request -> id (and back), plus how many
        # CacheDrops it has applied (sent with every frame so rank 0 knows which ids it may use).
        # (process set, name) -> (id, request): looked up by name (a short key whose string was
        # hashed already), then the request compared; a Request is a tuple whose hash is
        # recomputed at every lookup.
        self._cache_ids: dict[tuple[int, str], tuple[int, Request]] = {}
        self._cache_sigs: dict[int, Request] = {}
        self._hit_entries: dict[int, Entry] = {}  # what a cache hit's id expands to
        self._drops_seen = 0
        if self._coordinator is not None:
            for ps_id, info in process_sets.items():
                self._coordinator.set_process_set(ps_id, info.ranks)
        self._lock = threading.Lock()
        self._queue: list[Any] = []
        self._inflight: dict[tuple[int, str], Op] = {}
        self._join_op: Op | None = None
        self._handles: dict[int, Op] = {}
        self._next_handle = 0
        self._counters: dict[tuple[str, int], int] = {}
        self._error: str | None = None
        self._wake_r, self._wake_w = _channel.wake_pair()
        # True while the engine thread sleeps with nothing queued: only then does a submission
        # pay for a wake-up (a syscall and a GIL hand-over); a busy thread re-reads the queue.
        self._idle = False
        # When the queue last went from empty to not empty: submissions gather for a cycle or
        # more (HOROVOD_CYCLE_TIME, GATHER_CYCLES) before the engine takes them, so that a
        # caller issuing many operations is not interrupted by the engine thread for each one
        # (every hand-over of the GIL costs both threads), and they travel and fuse together.
        self._queued_since = 0.0
        self._last_queued = 0.0  # the latest submission (see GATHER_CYCLES)
        # Set by a caller that blocks on an operation: the engine takes and sends what is queued
        # now instead of waiting out the cycle, since that caller will submit nothing more until
        # it returns.
        self._flush = False
        # True while a worker's engine holds taken requests it has not sent yet: with an empty
        # queue as well, a blocking caller has nothing to flush and need not wake the thread.
        self._holding = False
        # The engine's rounds run under this lock, in the thread or in a blocked caller (see the
        # module's docstring); `_caller_drives` says which, `_running` ends them for good.
        self._drive = threading.Lock()
        self._caller_drives = False
        self.rounds = 0  # rounds run so far, by anyone (tests read it: an idle engine sleeps)
        self._running = True
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        if worker_socket is not None:
            self._sel.register(worker_socket, selectors.EVENT_READ)
        for rank, peer in self._peers.items():
            self._sel.register(peer, selectors.EVENT_READ, rank)
        self._sleeper = _sleeper_for(self._sel)
        # A worker's round state: requests taken but not sent yet, since when, and when it
        # asked the coordinator to shut down.
        self._unsent: list[Any] = []
        self._first_unsent = 0.0
        self._stopping_since: float | None = None
        # The coordinator's: why every rank must stop (None while all is well), stall watch.
        self._shutdown: str | None = None
        self._stall = (
            StallInspector(config.stall, self._coordinator)
            if self._coordinator is not None
            else None
        )
        self._single_threaded = threading.Event()
        threads = torch.get_num_threads()
        self._thread = threading.Thread(target=self._main, name="hora-torch-engine", daemon=True)
        self._thread.start()
        # torch's setting is global as well as per thread: give it back to every other thread.
        self._single_threaded.wait(10.0)
        torch.set_num_threads(threads)

    # ----- caller's thread -------------------------------------------------------------------
    def generated_name(self, kind: str, process_set_id: int) -> str:
        """Name an unnamed op; counted per kind and process set, so that ranks agree as long as
        they submit the same unnamed ops of a set in the same order (Horovod's contract)."""
        key = (kind, process_set_id)
        with self._lock:
            n = self._counters.get(key, 0)
            self._counters[key] = n + 1
        return f"{kind}.noname.{n}"

    def submit(self, op: Op, flush: bool = False) -> int:
        """Queue `op` and return its handle; a duplicate in-flight name raises ValueError.

        `flush`: the caller will wait for it next, so send it (and what is queued) at once
        rather than at the end of the gathering cycle (one wake-up of the engine, not two)."""
        with self._lock:
            if self._error is not None:
                raise HorovodInternalError(self._error)
            if op.request is None:
                if self._join_op is not None:
                    raise ValueError("join() is already in progress")
                self._join_op = op
                self._queue.append(_JOIN)
            else:
                key = (op.request.process_set_id, op.request.name)
                if key in self._inflight:
                    raise ValueError(
                        f"An operation named '{op.request.name}' is already in flight; names of "
                        "pending operations must be unique."
                    )
                self._inflight[key] = op
                self._last_queued = now = time.monotonic()
                if not self._queue:
                    self._queued_since = now
                self._queue.append(op.request)
            handle = self._next_handle
            self._next_handle += 1
            self._handles[handle] = op
            wake, self._idle = self._idle, False
            if flush and not self._flush:
                self._flush = wake = True
        rec = _th.recorder
        if rec.enabled and op.request is not None:
            rec.begin(op.request.name, "NEGOTIATE_" + op.request.kind.upper())
        if wake:
            self._wake()
        return handle

    def control(self, item: tuple[Any, ...]) -> None:
        """Queue a control message (process-set changes) in order with the submissions."""
        with self._lock:
            self._queue.append(item)
            self._idle = False
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
        """Drive the engine until `op` is done, or wait for whoever drives it now.

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
                if not self._flush and (self._queue or self._holding):
                    self._flush = True
                    self._wake()
                op.wait()
                return

    def _drive_until(self, op: Op) -> None:
        """Run the engine's rounds in this (caller's) thread until `op` is done."""
        if not self._running:
            op.wait()  # the engine has ended: `_fail_all` completes every operation
            return
        self._caller_drives = True
        self._flush = True  # this caller submits nothing until it returns: send what is queued
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
        """Hand the engine back to the thread: wake it if something is left to move (its
        sleep was computed before this caller's rounds) or if the engine has ended."""
        coord = self._coordinator
        if (
            not self._running
            or self._queue
            or self._unsent
            or self._inflight
            or self._join_op is not None
            or (coord is not None and (coord.has_pending() or coord.has_set_aside()))
        ):
            self._wake()

    def stop(self, timeout: float = 10.0) -> None:
        """Tell every rank we are shutting down and wait (bounded) for the thread to finish."""
        if self._thread.is_alive():
            with self._lock:
                self._queue.append(_SHUTDOWN)
                self._idle = False
                self._flush = True
            self._wake()
            self._thread.join(timeout)
        self._fail_all(SHUT_DOWN)
        if not self._thread.is_alive():
            if self._sleeper is not self._sel:
                self._sleeper.close()
            self._sel.close()
        for s in (self._wake_r, self._wake_w, self._sock, *self._peers.values()):
            if s is not None:
                s.close()

    @property
    def failed(self) -> str | None:
        return self._error

    @property
    def broken(self) -> bool:
        """Stopped by a failure (an error on some rank's engine, a lost peer), not by a rank's
        `shutdown()`: every rank's engine stopped with it, so every rank may start anew."""
        return self._error is not None and self._error != SHUT_DOWN

    def _wake(self) -> None:
        try:  # noqa: SIM105 - a hot path: suppress() costs a context manager per call
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full, so a wake-up is pending anyway

    # ----- engine thread ---------------------------------------------------------------------
    def _main(self) -> None:
        torch.set_grad_enabled(False)  # the engine moves data; autograd lives in the caller
        # One intra-op thread: with OpenMP, a thread's parallel ops get a team of their own, whose
        # workers would compete with the training thread's team for the cores; the engine's
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
        """One round (the drive lock held); any error ends the engine on every rank."""
        self.rounds += 1
        try:
            if self._coordinator is not None:
                wait = self._coordinator_step(timeout)
            else:
                wait = self._worker_step(timeout)
        except Exception as exc:
            self._crash(exc)
            raise
        if not self._running:
            self._wake()  # the thread (asleep, or waiting for the lock) sees it and ends
        return wait

    def _crash(self, exc: BaseException) -> None:
        log.debug("hora.torch engine stopped", exc_info=True)
        self._running = False
        reason = f"{SHUT_DOWN} ({type(exc).__name__}: {exc})"
        self._fail_all(reason)
        self._tell_peers(reason)
        self._wake()

    def _tell_peers(self, reason: str) -> None:
        """Best effort: make the other ranks fail now rather than at their backend's timeout."""
        try:
            if self._sock is not None:  # the reason, not _SHUTDOWN: this is no orderly stop
                _channel.send_msg(self._sock, (self._drops_seen, [Shutdown(reason)]))
            payload = _channel.pack([Shutdown(reason)])
            for peer in self._peers.values():
                _channel.send_payload(peer, payload)
        except OSError:
            pass

    def _due_at(self, first: float) -> float:
        """When gathering that began at `first` ends (see GATHER_CYCLES)."""
        cycle = self.config.cycle_time_s
        return min(first + GATHER_CYCLES * cycle, max(first, self._last_queued) + cycle)

    def _take_queue(self, idle_if_empty: bool = False) -> list[Any]:
        """Take what was submitted; with `idle_if_empty`, an empty queue marks the thread idle."""
        with self._lock:
            items, self._queue = self._queue, []
            self._idle = idle_if_empty and not items
            if items:
                self._holding = True  # under the lock: a blocking caller sees queue or this
        return items

    def _take_due(self) -> list[Any]:
        """Rank 0's take: what was submitted, once it is due (see `_gather_time`)."""
        with self._lock:
            if not self._queue:
                return []
            if not self._flush and time.monotonic() < self._due_at(self._queued_since):
                return []
            self._flush = False  # rank 0 takes all it holds at once: a flush is served
            items, self._queue = self._queue, []
        return items

    def _gather_time(self) -> float | None:
        """How long the queue may still gather before the engine takes it: 0.0 once a caller
        blocks (flush) or the gathering is due (`_due_at`); None when nothing is queued
        (the thread is then idle: the next submission wakes it)."""
        with self._lock:
            if not self._queue:
                self._idle = True
                return None
            if self._flush:
                return 0.0
            return max(0.0, self._due_at(self._queued_since) - time.monotonic())

    def _mark_idle(self) -> bool:
        """Declare the thread about to sleep; False (and stay awake) if work arrived meanwhile."""
        with self._lock:
            if self._queue:
                return False
            self._idle = True
            return True

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _apply_control(self, item: Any) -> bool:
        """Handle a control tuple; True when it was one."""
        if isinstance(item, tuple) and not isinstance(item, Request) and item[0] == "P":
            _, ps_id, ranks = item
            if self._coordinator is not None:
                self._coordinator.set_process_set(ps_id, ranks)
            return True
        return False

    def _worker_step(self, timeout: float | None) -> float | None:
        """A worker's round: take the coordinator's responses (waiting up to `timeout` for
        them), then send what is due; returns how long the engine may sleep (None: until
        something arrives)."""
        sock = self._sock
        assert sock is not None
        for key, _ in self._sel.select(timeout):
            if key.fileobj is self._wake_r:
                self._drain_wake()
                continue
            try:
                responses = _channel.recv_msg(sock)
            except (ConnectionError, OSError) as exc:
                raise ConnectionError("lost the connection to rank 0 (coordinator)") from exc
            if self._handle(responses):
                self._running = False
                return None
        flush, self._flush = self._flush, False  # read before the queue: none is missed
        now = time.monotonic()
        unsent = self._unsent
        for item in self._take_queue():
            if type(item) is Request or not self._apply_control(item):
                if not unsent:
                    self._first_unsent = now
                unsent.append(item)
        if unsent and (flush or now >= self._due_at(self._first_unsent) or _SHUTDOWN in unsent):
            if _th.recorder.enabled:
                _th.recorder.cycle()  # a negotiation round starts (CYCLE_START)
            ids = self._cache_ids  # a cached request travels as its id
            sent: list[Any] = []
            for item in unsent:
                if type(item) is Request:
                    hit = ids.get((item.process_set_id, item.name))
                    if hit is not None and (hit[1] is item or hit[1] == item):
                        item = hit[0]
                sent.append(item)
            _channel.send_msg(sock, (self._drops_seen, sent))
            if _SHUTDOWN in unsent:
                self._stopping_since = now
            self._unsent = []
            self._holding = False
        if self._stopping_since is not None:
            if now - self._stopping_since > self.config.timeout_s:
                raise ConnectionError("the coordinator did not acknowledge shutdown")
            return 0.5
        if self._unsent:
            return max(0.0, self._due_at(self._first_unsent) - now)
        return None if self._mark_idle() else 0.0

    def _coordinator_step(self, timeout: float | None) -> float | None:
        """Rank 0's round: take the workers' requests (waiting up to `timeout` for them) and
        its own once due, plan, send the responses and run them; returns how long the engine
        may sleep (None: until something arrives)."""
        coord = self._coordinator
        stall = self._stall
        assert coord is not None and stall is not None
        ready = self._sel.select(timeout)
        if _th.recorder.enabled:
            _th.recorder.cycle()  # a negotiation round starts (CYCLE_START)
        for key, _ in ready:
            if key.fileobj is self._wake_r:
                self._drain_wake()
                continue
            rank = key.data
            try:
                drops_seen, items = _channel.recv_msg(key.fileobj)  # type: ignore[arg-type]
            except (ConnectionError, OSError):
                self._sel.unregister(key.fileobj)
                self._peers.pop(rank, None)
                self._shutdown = self._shutdown or f"{SHUT_DOWN} (rank {rank} disconnected)"
                continue
            repeated = items and type(items[0]) is int and all(type(i) is int for i in items)
            if repeated and coord.offer(rank, tuple(items), time.monotonic()):
                coord.ack(rank, drops_seen)
                continue
            for item in items:
                if type(item) is int:
                    coord.submit_cached(rank, item)
                elif item == _SHUTDOWN:
                    self._shutdown = self._shutdown or SHUT_DOWN
                elif item == _JOIN:
                    coord.join(rank)
                elif type(item) is Shutdown:  # that rank's engine failed
                    self._shutdown = self._shutdown or item.reason
                else:
                    coord.submit(rank, item)
            coord.ack(rank, drops_seen)
        own = self._take_due()
        if own:
            ids = coord.own_ids(own)
            if ids is not None and coord.offer(0, ids, time.monotonic()):
                own = []
        for item in own:
            if type(item) is Request:
                coord.submit(0, item)
            elif self._apply_control(item):
                continue
            elif item == _SHUTDOWN:
                self._shutdown = self._shutdown or SHUT_DOWN
            elif item == _JOIN:
                coord.join(0)
            else:
                coord.submit(0, item)
        age = coord.stash_age(time.monotonic())
        if age is not None and age >= STASH_WAIT_S:
            coord.spill()  # a rank is late or differs: let the stall inspector see who
        responses: list[Any] = coord.take()
        if self._shutdown is None:
            self._shutdown = stall.inspect(bool(responses))
        if self._shutdown is not None:
            responses.append(Shutdown(self._shutdown))
        if responses:
            payload = _channel.pack(responses)
            for peer in list(self._peers.values()):
                try:
                    _channel.send_payload(peer, payload)
                except OSError:
                    self._shutdown = self._shutdown or SHUT_DOWN
            if self._handle(responses):
                self._running = False
                return None
        wait = stall.wake_in()
        gather = self._gather_time()
        if gather is not None:
            wait = gather if wait is None else min(wait, gather)
        age = coord.stash_age(time.monotonic())
        if age is not None:
            left = max(0.0, STASH_WAIT_S - age)
            wait = left if wait is None else min(wait, left)
        return wait

    def _handle(self, responses: list[Response | Shutdown]) -> bool:
        """Apply the coordinator's decisions in order; True once the engine must stop."""
        rec = _th.recorder
        worker = self._coordinator is None
        if worker:  # first, as everything below reads entries (a CacheDrop only ever comes last)
            for resp in responses:
                if isinstance(resp, Bucket):
                    self._learn(resp)
        queued = rec.enabled
        if queued:
            self._record_queued(responses)
        for resp in responses:
            if isinstance(resp, Bucket):
                self._run(resp, queued)
            elif isinstance(resp, CacheDrop):
                if worker:
                    for cid in resp.ids:
                        self._hit_entries.pop(cid, None)
                        sig = self._cache_sigs.pop(cid, None)
                        key = (sig.process_set_id, sig.name) if sig is not None else None
                        if key is not None and self._cache_ids.get(key, (-1,))[0] == cid:
                            del self._cache_ids[key]
                    self._drops_seen += 1
            elif isinstance(resp, Failure):
                info = self.process_sets.get(resp.process_set_id)
                if info is None or info.index < 0:
                    continue
                with self._lock:
                    op = self._inflight.pop((resp.process_set_id, resp.name), None)
                if op is not None:
                    if rec.enabled and op.request is not None:
                        rec.end(op.request.name, "NEGOTIATE_" + op.request.kind.upper())
                    op.complete(error=CollectiveRefusedError(resp.message))
            elif isinstance(resp, JoinDone):
                with self._lock:
                    op, self._join_op = self._join_op, None
                if op is not None:
                    op.complete(result=op.finish([resp.last_rank]))
            elif isinstance(resp, Shutdown):
                self._fail_all(resp.reason)
                return True
        return False

    def _learn(self, bucket: Bucket) -> None:
        """A worker's side of the response cache: remember the ids this bucket announces and
        expand the hits that travelled as bare ids."""
        info = self.process_sets.get(bucket.process_set_id)
        expand(bucket, self._cache_sigs, info.ranks if info is not None else (), self._hit_entries)
        for e in bucket.entries:
            if e.cache_id >= 0:
                req = self._cache_sigs[e.cache_id]
                self._cache_ids[(req.process_set_id, req.name)] = (e.cache_id, req)

    def _member(self, bucket: Bucket) -> bool:
        info = self.process_sets.get(bucket.process_set_id)
        return info is not None and info.index >= 0

    def _record_queued(self, responses: list[Response | Shutdown]) -> None:
        """The buckets of one response wait their turn on the data path: negotiation is over for
        all of them now, and each one's QUEUE lasts until it runs."""
        rec = _th.recorder
        for resp in responses:
            if isinstance(resp, Bucket) and self._member(resp):
                kind = resp.kind.upper()
                for e in resp.entries:
                    rec.end(e.name, "NEGOTIATE_" + kind)
                    rec.begin(e.name, kind)
                    rec.begin(e.name, "QUEUE")

    def _run(self, bucket: Bucket, queued: bool) -> None:
        """Run a bucket; `queued`: its QUEUE phase was recorded and ends now."""
        if not self._member(bucket):
            return
        info = self.process_sets[bucket.process_set_id]
        with self._lock:
            ops = [
                self._inflight.pop((bucket.process_set_id, e.name), None) for e in bucket.entries
            ]
        rec = _th.recorder
        if queued:
            for e in bucket.entries:
                rec.end(e.name, "QUEUE")
        try:
            run_bucket(bucket, [op.local if op is not None else None for op in ops], info)
        except Exception as exc:
            error = HorovodInternalError(f"{bucket.kind} failed: {type(exc).__name__}: {exc}")
            for op in ops:
                if op is not None:
                    op.complete(error=error)
            raise
        if queued:
            for entry in bucket.entries:
                ref = entry.ref
                rec.end(
                    entry.name,
                    bucket.kind.upper(),
                    {
                        "dtype": ",".join(ref.dtypes),
                        "shape": [list(s) for s in ref.shapes],
                        "bytes": ref.nbytes,
                    },
                )
        waiters = []
        for op in ops:
            if op is None:
                continue
            try:
                op.result = op.finish(op.local.outputs or [])
            except Exception as exc:  # a finishing step (e.g. a copy) failed on this rank only
                op.error = exc
            op.done = True
            if op._event is not None:  # read after `done` was set: see Op
                waiters.append(op._event)
        # Waiters are woken once every operation of the bucket is done: a caller synchronizing
        # them in turn then blocks (and is woken, a thread hand-over) once, not once per op.
        for event in waiters:
            event.set()

    def _fail_all(self, reason: str) -> None:
        with self._lock:
            if self._error is None:
                self._error = reason
            ops = list(self._inflight.values())
            self._inflight.clear()
            if self._join_op is not None:
                ops.append(self._join_op)
                self._join_op = None
        for op in ops:
            if not op.done:
                op.complete(error=HorovodInternalError(reason))
