"""Watching one attempt: hand out the job, relay logs, collect results, tell a failure's story.

Everything the group reports arrives on one queue, handled on the caller's thread, so logs print
in order and nothing prints after the attempt is over. The monitor decides nothing about
restarts: it returns the results, or raises the attempt's `WorkerFailedError` /
`RunTimeoutError` for the failure policy to judge. It goes through explicit states
(`AttemptState`); the console, output files, timeline, metrics and growth watch are callbacks
(`hora.job.callbacks`) told of each change, output line, report and turn of the loop.
"""

from __future__ import annotations

import contextlib
import queue
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hora.engines import Capabilities
from hora.errors import RunTimeoutError, WorkerFailedError
from hora.job import in_place
from hora.job.callbacks import AttemptState, MonitorCallback
from hora.job.elastic import AttemptResized, resumed
from hora.job.failures import Failure, exit_failure, not_started, past_timeout, story
from hora.job.silence import silence_seconds, silent
from hora.job.stacks import StackRequest, take_request
from hora.job.world import Phase, Restart, World
from hora.wire.channel import Connection
from hora.wire.protocol import (
    EngineFailed,
    Error,
    Exited,
    Heartbeat,
    Hello,
    Metrics,
    Output,
    Payload,
    Reform,
    Resized,
    Result,
    Resumed,
    Stacks,
    Stall,
    TimelineBatch,
)

TAIL_LINES = 30
SETTLE_SECONDS = 0.3  # after a first failure, wait this long for its cause to be reported too
EXIT_GRACE_SECONDS = 10.0  # after every result is in, how long ranks get to exit by themselves


class Group(Protocol):
    """What the monitor needs of a worker group (a real `WorkerGroup`, or a test's fake)."""

    @property
    def events(self) -> queue.SimpleQueue | queue.Queue: ...

    @property
    def capabilities(self) -> Capabilities: ...


@dataclass(frozen=True)
class Limits:
    """When an attempt must give up: absolute `time.monotonic()` deadlines."""

    start_timeout: float  # seconds for every rank of this attempt to connect
    timeout: float | None  # the run's whole `timeout`, for the message
    deadline: float | None  # when the run's `timeout` runs out (across attempts)


_LIFECYCLE = (Hello, Result, Error, Exited, EngineFailed)
#: what may end a rank's part in the attempt: the loop turns at once after it
_ENDS_A_PART = (Result, Error, Exited, EngineFailed, Resized)
TICK_SECONDS = 0.05
BUSY_TURN = 16  # messages in a turn past which the loop takes the rest at the next turn


class Monitor:
    """One attempt of a run. `watch()` returns the raw (pickled) results by rank."""

    def __init__(
        self,
        group: Group,
        np: int,
        payload: bytes,
        collect_all: bool,
        callbacks: Sequence[MonitorCallback] = (),
        in_place_min_np: int | None = None,
        known_commit: int = -1,
    ):
        self.group = group
        self.np = np
        self.payload = payload
        self.collect_all = collect_all
        self.callbacks = tuple(callbacks)
        self.started: dict[int, str] = {}  # rank -> host
        self.results: dict[int, bytes | None] = {}
        self.exits: dict[int, int] = {}
        self.closed: set[int] = set()  # ranks whose worker channel has closed (fully read)
        self.failures: dict[int, Failure] = {}
        self.tails: dict[int, deque[str]] = {r: deque(maxlen=TAIL_LINES) for r in range(np)}
        self.stall: str | None = None  # rank 0's standing stall warning (the stall inspector)
        self.stuck: tuple[int, ...] = ()  # the ranks that warning waits for
        self.connections: dict[int, Connection] = {}  # each started rank's channel
        self.orders: dict[int, Reform] = {}  # process id -> its place in the latest world ordered
        self.dump: StackRequest | None = None  # asked when the run is stopped: in its story
        self.asked_by_user: StackRequest | None = None  # printed once answered, the run goes on
        self.last_heard: dict[int, float] = {}  # rank -> time.monotonic() of its last message
        self.silence_s = silence_seconds()
        self._silence_due = 0.0  # no rank can be silent before it (`silence.silent`)
        self.resized: dict[int, int] = {}  # rank -> the commit it stopped at, to grow
        self.known_commit = known_commit  # the newest commit of the run the driver knows of
        #: its ranks by process, re-formed in place where the engine can (`in_place_min_np`:
        #: the fewest ranks it may shrink to; None: a lost rank ends the attempt)
        self.world = World(np, in_place_min_np)
        self.start_timeout = 0.0  # the attempt's: how long new ranks have to reach the world
        self.state = AttemptState.STARTING
        for callback in self.callbacks:
            callback.on_state(self, None, self.state)

    # -- its state --------------------------------------------------------------------------
    def _enter(self, state: AttemptState) -> None:
        previous, self.state = self.state, state
        if state is not previous:
            for callback in self.callbacks:
                callback.on_state(self, previous, state)

    def _judged(self) -> AttemptState:
        """The state the ranks' reports so far put a running attempt in."""
        if self.failures:
            return AttemptState.FAILING
        if len(self.results) >= self.np:
            return AttemptState.FINISHING
        if len(self.started) >= self.np:  # more: new ranks on their way to grow it in place
            return AttemptState.RUNNING
        return AttemptState.STARTING

    @property
    def stopping(self) -> bool:
        """The group was stopped (the driver sets it): what comes now is drained, not judged."""
        return self.state is AttemptState.STOPPING

    @stopping.setter
    def stopping(self, value: bool) -> None:
        if value:
            self.world.stop()
            self._enter(AttemptState.STOPPING)

    # -- the loop ---------------------------------------------------------------------------
    def watch(self, limits: Limits) -> dict[int, bytes | None]:
        """Every message handled as it comes (past BUSY_TURN in a turn, the rest at the next:
        one wake-up a turn for a thousand ranks' reports); a turn (silence, state, ticks, the
        end, limits) every TICK_SECONDS and after a message that may end a rank's part."""
        start_deadline = time.monotonic() + limits.start_timeout
        self.start_timeout = self.world.confirm_wait = limits.start_timeout
        self._all_done_at: float | None = None
        next_turn, handled = 0.0, 0
        while True:
            now = time.monotonic()
            if now >= next_turn:
                if self._turn(now, limits, start_deadline):
                    self._enter(AttemptState.SUCCEEDED)
                    return self.results
                next_turn, handled = now + TICK_SECONDS, 0
            try:
                busy = handled >= BUSY_TURN
                conn, message = self.group.events.get(not busy, max(0.0, next_turn - now))
            except queue.Empty:
                time.sleep(max(0.0, next_turn - now) if busy else 0.0)
                continue
            self.handle(conn, message)
            handled += 1
            if message is None or isinstance(message, _ENDS_A_PART):
                next_turn = 0.0

    def _turn(self, now: float, limits: Limits, start_deadline: float) -> bool:
        """One turn of the loop; True once the attempt succeeded."""
        self._serve_user_dump()
        self._note_silent_ranks(now)
        self._enter(self._judged())
        for callback in self.callbacks:
            callback.on_tick(self, now)
        if self._finished_attempt(now):
            return True
        self._check_limits(limits, start_deadline, now)
        return False

    def _finished_attempt(self, now: float) -> bool:
        """Every rank returned (and exited, or had its grace to): True. A failure raises its
        story once the settle time and any question to the ranks are over; every rank stopped
        at the same commit to grow raises AttemptResized."""
        late = self.world.late(now, time.time())
        if isinstance(late, Restart):  # a failure of the attempt, told as any other
            self.failures.setdefault(0, Failure(0, late.why, "", False, time.time()))
        else:
            self._decided(late)
        if self.failures:
            first = min(f.time for f in self.failures.values())
            settled = time.time() - first >= SETTLE_SECONDS
            if settled and self._may_go_on():
                decisions = self.world.lose(in_place.losses(self), first, in_place.why(self))
                for decision in decisions:
                    if not isinstance(decision, Restart):
                        self._decided(decision)
                if not self.failures:
                    return False
            if settled and self._stacks_in(now):
                self._enter(AttemptState.FAILED)
                raise self.failure_error()
            return False
        if len(self.resized) == self.np:
            self._enter(AttemptState.RESIZED)
            raise AttemptResized(max(self.resized.values()))
        if len(self.results) < self.np:
            return False
        self._all_done_at = self._all_done_at or now
        return len(self.exits) == self.np or now - self._all_done_at > EXIT_GRACE_SECONDS

    # -- in place (`hora.job.world` decides, `hora.job.in_place` carries out) ---------------
    def _may_go_on(self) -> bool:
        """The world may be asked to go on without the lost ranks: an attempt that may re-form,
        not stopped or asked where it is, and no survivor done already."""
        if self.world.min_np is None or self.world.phase is Phase.RESTARTING:
            return False
        lost = in_place.lost(self)
        survivors = [r for r in range(self.np) if r not in lost]
        return not self.stopping and self.dump is None and not any(map(self._finished, survivors))

    def _decided(self, decision: Any) -> None:
        if decision is not None:
            record = in_place.carry_out(self, decision, TAIL_LINES)
            for callback in self.callbacks if record is not None else ():
                callback.on_report(record)

    @property
    def may_grow(self) -> bool:
        """Whether the growth watch may judge now: every rank's hvd.elastic.run has said
        whether it can re-form, and no change of the world is under way."""
        return self.world.min_np is None or self.world.phase is Phase.RUNNING

    def grow_in_place(self, size: int) -> bool:
        """Start new ranks for a world of `size` that the running ranks re-form into at their
        next commit; False when they cannot (the run may grow by a restart instead)."""
        if self.failures:
            return False
        can_add = self.group.capabilities.grows_in_place
        start = self.world.grow(size, can_add, time.monotonic(), self.start_timeout, time.time())
        self._decided(start)
        return start is not None

    def _check_limits(self, limits: Limits, start_deadline: float, now: float) -> None:
        """Raise RunTimeoutError when the ranks did not all start in time, or the run's timeout
        passed (after asking the ranks where they are)."""
        np = self.np
        if len(self.started) < np and now > start_deadline:
            missing = [r for r in range(np) if r not in self.started]
            self._enter(AttemptState.TIMED_OUT)
            raise not_started(missing, np, limits.start_timeout)
        if limits.deadline is not None and now > limits.deadline:
            if self.dump is None:
                self.dump = self._ask_where(f"the run reached timeout={limits.timeout:g} s")
            if self._stacks_in(now):
                self._enter(AttemptState.TIMED_OUT)
                raise self.timeout_error(limits)

    def handle(self, conn: Connection | None, message: Any) -> None:
        peer = getattr(conn, "peer", None)
        if peer is not None:
            peer = self.world.rank_of(peer)
            if peer is None:
                return  # a rank lost before its world was re-formed in place
            self.last_heard[peer] = time.monotonic()
        if isinstance(message, Heartbeat):
            return  # heard: that is all it says
        if isinstance(message, Hello):
            assert conn is not None  # a hello only ever arrives on a worker's channel
            self._hello(conn, message.rank, message.host)
            return
        translated = in_place.translate(self.world, message)
        if translated is None and message is not None:
            return  # from a rank lost to a re-formed world
        if translated is None or isinstance(translated, _LIFECYCLE):
            self._lifecycle(conn, translated)  # None: a channel closed
        else:
            self._report(translated)

    def _lifecycle(self, conn: Connection | None, message: Any) -> None:
        """How a rank's process starts and ends."""
        match message:
            case None:  # a channel closed; the launcher reports the process's exit
                peer = getattr(conn, "peer", None)
                self._closed(self.world.rank_of(peer) if peer is not None else None)
            case Result(rank=rank, data=data):
                self.results[rank] = data
            case Error(rank=rank, summary=summary, traceback=tb, time=when, exception=raised):
                self.failures[rank] = Failure(rank, summary, tb, True, when, exception=raised)
            case Exited(rank=rank, code=code):
                self._exited(rank, code)
            case EngineFailed(rank=rank, summary=summary, detail=detail, subject=subject):
                failure = Failure(
                    rank, summary, detail, False, time.time(), subject, by_engine=True
                )
                self.failures.setdefault(rank, failure)

    def _report(self, message: Any) -> None:
        """What a running rank says: its output, stalls, resizes and stacks here; the rest (its
        timeline, metrics, a resume) to the callbacks."""
        message = in_place.hear(self.world, message, self._decided)
        match message:
            case None:
                return
            case Output(rank=rank, stream=stream, text=text):
                self._output(rank, stream, text)
                return
            case Stall(text=text, missing=missing, stopping=stopping):
                self._stall(text, missing, stopping)
                return
            case Resized(rank=rank, commit=commit):
                self.resized[rank] = commit
                return
            case Resumed(commit=commit, size=size):
                said = resumed(commit, size, self.known_commit)
                print(f"hora: {said}", file=sys.stderr, flush=True)
            case Stacks(rank=rank, text=text):
                for request in (self.dump, self.asked_by_user):
                    if request is not None:
                        request.answer(rank, text)
                return
        for callback in self.callbacks:
            callback.on_report(message)

    def _closed(self, rank: int | None) -> None:
        if rank is not None:
            self.closed.add(rank)
            if self.exits.get(rank) == 0:  # its exit came before its channel drained
                self._exited(rank, 0)

    def _hello(self, conn: Connection, pid: int, host: str) -> None:
        """A process connected: it gets the job as its rank now, unless it is unknown, gone
        (a new rank of a growth given up: it ends itself) or already here."""
        rank = self.world.started(pid, host) if isinstance(pid, int) else None
        if rank is None or rank in self.started:
            conn.close()
            return
        conn.peer = pid
        self.started[rank] = host
        self.connections[rank] = conn
        self.last_heard[rank] = time.monotonic()
        conn.send(Payload(self.payload, self.collect_all or rank == 0))
        if pid in self.orders:  # its world was re-formed before it said hello
            conn.send(self.orders[pid])

    def _stall(self, text: str | None, missing: tuple[int, ...], stopping: bool) -> None:
        """Rank 0's engine reports a stall (None: it is over); said on stderr, kept for timeouts.
        When it stops every rank, ask them where they are first."""
        self.stall, self.stuck = text, tuple(missing) if text is not None else ()
        if text is not None:
            print(f"hora: stall: {text}", file=sys.stderr, flush=True)
        if stopping and self.dump is None and not self.stopping:
            self.dump = self._ask_where("the stall inspector stopped them")

    def _note_silent_ranks(self, now: float) -> None:
        """A running rank not heard from for the silence time fails the attempt, naming its
        host: a cut-off host's ranks would otherwise wait in their collectives for ever.
        Looked at (every rank) only once one could be silent: its last word's time + silence."""
        if now < self._silence_due:
            return
        found, self._silence_due = silent(self, now, self.silence_s, self._finished)
        for rank, failure in found.items():
            self.failures[rank] = failure  # said now: the engine's stop may take seconds more
            print(f"hora: {failure.headline()}; stopping the attempt", file=sys.stderr, flush=True)

    def _finished(self, rank: int) -> bool:
        return any(rank in done for done in (self.results, self.exits, self.closed, self.resized))

    def send_all(self, message: Any) -> None:
        """Send `message` to every rank whose channel is still open."""
        for rank, conn in self.connections.items():
            if rank not in self.closed:
                with contextlib.suppress(OSError):
                    conn.send(message)

    # -- where each rank is -----------------------------------------------------------------
    def _ask_where(self, why: str) -> StackRequest:
        live = {r: c for r, c in self.connections.items() if r not in self.closed}
        return StackRequest(live, why)

    def _stacks_in(self, now: float) -> bool:
        """No question to the ranks is pending (the story waits a few seconds for answers)."""
        return self.dump is None or self.dump.complete(now)

    def _stack_report(self, request: StackRequest) -> str:
        ended = {*self.exits, *self.failures, *self.results}
        hosts = self.started if self.group.capabilities.names_hosts else None
        return request.report(self.stuck, hosts, ended)

    def _serve_user_dump(self) -> None:
        """The user asked (SIGUSR1 to `hora run`): ask the ranks, print their answers, go on."""
        if take_request() and self.asked_by_user is None:
            self.asked_by_user = self._ask_where("you asked (SIGUSR1)")
        request = self.asked_by_user
        if request is not None and request.complete():
            self.asked_by_user = None
            print(f"hora: {self._stack_report(request)}", file=sys.stderr, flush=True)

    def timeout_error(self, limits: Limits) -> RunTimeoutError:
        running = [r for r in range(self.np) if r not in self.results]
        where = self._stack_report(self.dump) if self.dump is not None else None
        return past_timeout(running, limits.timeout, self.stall, where)

    def _output(self, rank: int, stream: str, text: str) -> None:
        self.tails[rank].append(text.rstrip("\r"))
        host = self.started.get(rank)
        where = f"{rank}@{host}" if host and self.group.capabilities.names_hosts else f"{rank}"
        for callback in self.callbacks:
            callback.on_output(rank, where, stream, text)

    def _exited(self, rank: int, code: int) -> None:
        self.exits[rank] = code
        if self.stopping or rank in self.failures:
            return
        unfinished = rank not in self.results and rank not in self.resized
        drained = rank in self.closed or rank not in self.started
        failure = exit_failure(rank, code, unfinished, drained)
        if failure is not None:
            self.failures[rank] = failure

    def drain(self) -> None:
        """After the group stopped: print what was said before; nothing is lost at exit."""
        self.stopping = True
        while True:
            try:
                _conn, message = self.group.events.get_nowait()
            except queue.Empty:
                return
            if isinstance(message, Output | TimelineBatch | Stall | Metrics):
                self.handle(None, message)

    def failure_error(self) -> WorkerFailedError:
        dump = self._stack_report(self.dump) if self.dump is not None else None
        return story(self.failures, self.tails, dump)
