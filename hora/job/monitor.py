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
import os
import queue
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hora.engines.process import describe_exit
from hora.errors import RunTimeoutError, WorkerFailedError
from hora.job.callbacks import AttemptState, MonitorCallback
from hora.job.elastic import AttemptResized
from hora.job.failures import Failure, story
from hora.job.growing import Growth
from hora.job.in_place import Renumbering
from hora.job.stacks import StackRequest, take_request
from hora.wire.channel import Connection
from hora.wire.protocol import (
    EngineFailed,
    Error,
    Exited,
    Hello,
    Metrics,
    Output,
    Payload,
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
# A running rank sends a heartbeat every 2 s (hora.rank.worker); this long without a word from it,
# its host is taken as cut off (or the process as frozen), and the attempt fails naming it.
SILENCE_VAR = "HORA_HEARTBEAT_TIMEOUT_SECONDS"
DEFAULT_SILENCE_SECONDS = 30.0


class Group(Protocol):
    """What the monitor needs of a worker group (a real `WorkerGroup`, or a test's fake)."""

    events: queue.Queue

    @property
    def multi_host(self) -> bool: ...


@dataclass(frozen=True)
class Limits:
    """When an attempt must give up: absolute `time.monotonic()` deadlines."""

    start_timeout: float  # seconds for every rank of this attempt to connect
    timeout: float | None  # the run's whole `timeout`, for the message
    deadline: float | None  # when the run's `timeout` runs out (across attempts)


_LIFECYCLE = (Hello, Result, Error, Exited, EngineFailed)


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
        self.dump: StackRequest | None = None  # asked when the run is stopped: in its story
        self.asked_by_user: StackRequest | None = None  # printed once answered, the run goes on
        self.last_heard: dict[int, float] = {}  # rank -> time.monotonic() of its last message
        self.silence_s = silence_seconds()
        self.resized: dict[int, int] = {}  # rank -> the commit it stopped at, to grow
        self.known_commit = known_commit  # the newest commit of the run the driver knows of
        #: an elastic attempt whose engine can re-form it: the fewest ranks it may shrink to in
        #: place (None: a lost rank ends the attempt, as on any engine)
        self.renumbering = Renumbering(np, in_place_min_np)
        self.growth = Growth(np, TAIL_LINES)  # new ranks started to grow the attempt in place
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
            self._enter(AttemptState.STOPPING)

    # -- the loop ---------------------------------------------------------------------------
    def watch(self, limits: Limits) -> dict[int, bytes | None]:
        start_deadline = time.monotonic() + limits.start_timeout
        self.growth.start_timeout = limits.start_timeout
        self._all_done_at: float | None = None
        while True:
            now = time.monotonic()
            self._serve_user_dump()
            self._note_silent_ranks(now)
            self._enter(self._judged())
            for callback in self.callbacks:
                callback.on_tick(self, now)
            if self._finished_attempt(now):
                self._enter(AttemptState.SUCCEEDED)
                return self.results
            self._check_limits(limits, start_deadline, now)
            try:
                conn, message = self.group.events.get(timeout=0.05)
            except queue.Empty:
                continue
            self.handle(conn, message)

    def _finished_attempt(self, now: float) -> bool:
        """Every rank returned (and exited, or had its grace to): True. A failure raises its
        story once the settle time and any question to the ranks are over; every rank stopped
        at the same commit to grow raises AttemptResized."""
        self.growth.late(self, now)
        if self.failures:
            first = min(f.time for f in self.failures.values())
            settled = time.time() - first >= SETTLE_SECONDS
            if settled and self._may_reform():
                self.renumbering.reform(self, first)
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

    def _may_reform(self) -> bool:
        """The attempt may shrink in place instead of failing (`hora.job.in_place`)."""
        live = not self.stopping and self.dump is None and self.growth.joiners is None
        return live and self.renumbering.possible(self, self._finished)

    # -- growing in place (`hora.job.growing`) ----------------------------------------------
    @property
    def may_grow(self) -> bool:
        """Whether the growth watch may judge now (`hora.job.growing.Growth.ready`)."""
        return self.growth.ready(self, self.renumbering)

    def grow_in_place(self, size: int) -> bool:
        """Start new ranks for a world of `size` that the running ranks re-form into at their
        next commit; False when they cannot (the run may grow by a restart instead)."""
        record = self.growth.start(self, self.renumbering, self.group, size)
        for callback in self.callbacks if record is not None else ():
            callback.on_report(record)
        return record is not None

    def _check_limits(self, limits: Limits, start_deadline: float, now: float) -> None:
        """Raise RunTimeoutError when the ranks did not all start in time, or the run's timeout
        passed (after asking the ranks where they are)."""
        np = self.np
        if len(self.started) < np and now > start_deadline:
            missing = [r for r in range(np) if r not in self.started]
            self._enter(AttemptState.TIMED_OUT)
            raise RunTimeoutError(
                f"{len(missing)} of {np} workers did not start within start_timeout="
                f"{limits.start_timeout:g} s: ranks {_ranks(missing)} never connected "
                "to the driver. Check that the cluster has free slots and that workers can "
                "reach the driver, or raise start_timeout.",
                missing,
            )
        if limits.deadline is not None and now > limits.deadline:
            if self.dump is None:
                self.dump = self._ask_where(f"the run reached timeout={limits.timeout:g} s")
            if self._stacks_in(now):
                self._enter(AttemptState.TIMED_OUT)
                raise self.timeout_error(limits)

    def handle(self, conn: Connection | None, message: Any) -> None:
        peer = getattr(conn, "peer", None)
        if peer is not None:
            peer = self.renumbering.now.get(peer)
            if peer is None:
                return  # a rank lost before its world was re-formed in place
            self.last_heard[peer] = time.monotonic()
        translated = self.renumbering.translate(message)
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
                self._closed(self.renumbering.now.get(peer) if peer is not None else None)
            case Hello(rank=rank, host=host):
                assert conn is not None  # a hello only ever arrives on a worker's channel
                self._hello(conn, rank, host)
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
        message = self.renumbering.report(self.growth.report(self, self.renumbering, message))
        if message is None:
            return
        match message:
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
                print(f"hora: {self._resumed(commit, size)}", file=sys.stderr, flush=True)
            case Stacks(rank=rank, text=text):
                for request in (self.dump, self.asked_by_user):
                    if request is not None:
                        request.answer(rank, text)
                return
        for callback in self.callbacks:
            callback.on_report(message)

    def _resumed(self, commit: int, size: int) -> str:
        made = f"{size} rank{'s' if size != 1 else ''}"
        said = f"the ranks resumed from commit {commit} (made by {made})"
        if commit < self.known_commit:  # the newest commit's hosts are not this attempt's
            said += (
                f", not from commit {self.known_commit}: no host of this attempt holds it "
                f"(commits live on the hosts that made them), so the steps after commit {commit} "
                "are trained again"
            )
        return said

    def _closed(self, rank: int | None) -> None:
        if rank is not None:
            self.closed.add(rank)
            if self.exits.get(rank) == 0:  # its exit came before its channel drained
                self._exited(rank, 0)

    def _hello(self, conn: Connection, rank: int, host: str) -> None:
        """A rank connected: it gets the job, unless the rank is unknown or already here."""
        known = (isinstance(rank, int) and 0 <= rank < self.np) or self.growth.expects(rank)
        if not known or rank in self.started:
            conn.close()
            return
        conn.peer = self.renumbering.first(rank)
        self.started[rank] = host
        self.connections[rank] = conn
        self.last_heard[rank] = time.monotonic()
        conn.send(Payload(self.payload, self.collect_all or rank == 0))

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
        host: a cut-off host's ranks would otherwise wait in their collectives for ever."""
        if not self.silence_s:
            return
        for rank, heard in self.last_heard.items():
            silent = now - heard
            if silent < self.silence_s or rank in self.failures or self._finished(rank):
                continue
            host = self.started.get(rank, "?")
            self.failures[rank] = Failure(
                rank,
                f"no word from it for {silent:.0f} s ({SILENCE_VAR}={self.silence_s:g}): host "
                f"{host} is unreachable (network cut, or the host is gone) or the process is "
                "frozen",
                "",
                False,
                time.time(),
                subject=f"rank {rank} on host {host}",
            )

    def _finished(self, rank: int) -> bool:
        return (
            rank in self.results
            or rank in self.exits
            or rank in self.closed
            or rank in self.resized
        )

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
        return request.report(self.stuck, self.started if self.group.multi_host else None, ended)

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
        stall = f"\nThey were stalled: {self.stall}" if self.stall else ""
        where = f"\n\n{self._stack_report(self.dump)}" if self.dump is not None else ""
        return RunTimeoutError(
            f"the job ran past timeout={limits.timeout:g} s and was stopped; "
            f"ranks {_ranks(running)} had not finished.{stall}{where}",
            running,
        )

    def _output(self, rank: int, stream: str, text: str) -> None:
        self.tails[rank].append(text.rstrip("\r"))
        host = self.started.get(rank)
        where = f"{rank}@{host}" if host and self.group.multi_host else f"{rank}"
        for callback in self.callbacks:
            callback.on_output(rank, where, stream, text)

    def _exited(self, rank: int, code: int) -> None:
        self.exits[rank] = code
        if self.stopping or rank in self.failures:
            return
        if code != 0:
            self.failures[rank] = Failure(rank, describe_exit(code), "", False, time.time())
        elif (
            rank not in self.results
            and rank not in self.resized
            and (rank in self.closed or rank not in self.started)
        ):
            # A result still in flight on the channel arrives before the channel's close, so a
            # clean exit without a result is judged only once the channel has drained.
            self.failures[rank] = Failure(
                rank,
                "exited with status 0 before returning a result (os._exit?)",
                "",
                False,
                time.time(),
            )

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


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def silence_seconds() -> float:
    """How long a running rank may stay silent (0: never judged silent)."""
    value = os.environ.get(SILENCE_VAR, "")
    try:
        return float(value) if value else DEFAULT_SILENCE_SECONDS
    except ValueError:
        raise ValueError(f"{SILENCE_VAR}={value!r} is not a number of seconds") from None
