"""What the ranks and their launcher say during an attempt, into its records.

Each message names its process (`hora.job.records`): a hello gets the job, a result, an error,
an exit or a closed channel ends a rank's part, and what a running rank reports goes to the
world (`hora.job.in_place.hear`), the stacks asked for, or the callbacks, naming its rank now.
Whatever comes from a process the world left is dropped. Nothing here judges the attempt: its
controller (`hora.job.attempt`) reads the records at each turn.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from hora.job import in_place
from hora.job.callbacks import MonitorCallback
from hora.job.elastic import resumed
from hora.job.failures import Failure, exit_failure
from hora.job.records import Records
from hora.job.stacks import Questions, StackRequest
from hora.job.world import ReformWorld, World
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
    Resized,
    Result,
    Resumed,
    Stacks,
    Stall,
    TimelineBatch,
)


class Hearing:
    """One attempt's ear: `hearing(connection, message)` for each message, in order."""

    def __init__(
        self,
        records: Records,
        payload: bytes,
        collect_all: bool,
        names_hosts: bool,
        callbacks: Sequence[MonitorCallback],
        known_commit: int = -1,
    ) -> None:
        self.records = records
        self.world: World = records.world
        self.payload = payload
        self.collect_all = collect_all
        self.names_hosts = names_hosts
        self.callbacks = tuple(callbacks)
        self.known_commit = known_commit  # the newest commit of the run the driver knows of
        self.questions = Questions()  # where the ranks are: for the story, or the user
        self.stall: str | None = None  # rank 0's standing stall warning (the stall inspector)
        self.stuck: tuple[int, ...] = ()  # the ranks that warning waits for
        self.stopping = False  # the group was stopped: exits are drained, not judged

    def forget_stall(self) -> None:
        """The world changed: the stall its ranks reported is over (that world is gone)."""
        self.stall, self.stuck = None, ()

    def ask_where(self, why: str) -> None:
        """Ask every rank whose channel is open where it is, for the story (once)."""
        self.questions.ask(self.records.connections(open_only=True), why)

    def stack_report(self, request: StackRequest) -> str:
        ended = self.records.ranks_where("ended")
        hosts = self.records.hosts() if self.names_hosts else None
        return request.report(self.stuck, hosts, ended)

    def serve_user_dump(self) -> None:
        """The user asked (SIGUSR1 to `hora run`): ask the ranks, print their answers, go on."""
        answered = self.questions.serve_user(self.records.connections(open_only=True))
        if answered is not None:
            print(f"hora: {self.stack_report(answered)}", file=sys.stderr, flush=True)

    def __call__(self, conn: Connection | None, message: Any) -> ReformWorld | None:
        """One message: from a rank (its process named by its id) or its launcher; None: a
        channel closed. Whatever comes from a process the world left is dropped. What the world
        decided on it, for the attempt's hands (`hora.job.in_place.Hands`)."""
        peer = getattr(conn, "peer", None)
        if peer is not None:
            if self.world.rank_of(peer) is None:
                return None  # a rank lost before its world was re-formed in place
            self.records.heard(peer)
        pid = getattr(message, "rank", None) if isinstance(message, in_place.FROM_A_RANK) else None
        if pid is not None and self.world.rank_of(pid) is None:
            return None  # from (or about) a rank lost to a re-formed world
        match message:
            case Heartbeat():
                pass  # heard: that is all it says
            case Hello(rank=pid, host=host):
                assert conn is not None  # a hello only ever arrives on a worker's channel
                self._hello(conn, pid, host)
            case None | Result() | Error() | Exited() | EngineFailed():
                self._lifecycle(peer, message)
            case _:
                return self._report(message)
        return None

    def _lifecycle(self, peer: int | None, message: Any) -> None:
        """How a rank's process ends: its result, its error, its exit, the engine's word, or
        its channel's close (None)."""
        match message:
            case None:  # a channel closed; the launcher reports the process's exit
                self._closed(peer)
            case Result(rank=pid, data=data):
                record = self.records.of(pid)
                record.returned, record.result = True, data
            case Error(rank=pid, summary=summary, traceback=tb, time=when, exception=raised):
                failure = Failure(pid, summary, tb, True, when, exception=raised)
                self.records.fail(pid, failure)
            case Exited(rank=pid, code=code):
                self._exited(pid, code)
            case EngineFailed(rank=pid, summary=summary, detail=detail, subject=subject):
                failure = Failure(pid, summary, detail, False, time.time(), subject, by_engine=True)
                self.records.fail(pid, failure, replace=False)

    def _report(self, message: Any) -> ReformWorld | None:
        """What a running rank says: its word on the world to the world (what it decided comes
        back), its output, stalls, resizes and stacks here; the rest (its timeline, metrics, a
        resume) to the callbacks, naming its rank now."""
        message = in_place.hear(self.world, message)
        match message:
            case None:
                return None
            case ReformWorld():
                return message
            case Output(rank=pid, stream=stream, text=text):
                self._output(pid, stream, text)
                return None
            case Stall(text=text, missing=missing, stopping=stopping):
                self._stall(text, missing, stopping)
                return None
            case Resized(rank=pid, commit=commit):
                self.records.of(pid).stopped_at = commit
                return None
            case Resumed(commit=commit, size=size):
                said = resumed(commit, size, self.known_commit)
                print(f"hora: {said}", file=sys.stderr, flush=True)
            case Stacks(rank=pid, text=text):
                self.questions.answer(self._rank(pid), text)
                return None
            case TimelineBatch() | Metrics():
                message = message._replace(rank=self._rank(message.rank))
        for callback in self.callbacks:
            callback.on_report(message)
        return None

    def _rank(self, pid: int) -> int:
        rank = self.world.rank_of(pid)
        return pid if rank is None else rank

    def _closed(self, pid: int | None) -> None:
        if pid is not None:
            record = self.records.of(pid)
            record.closed = True
            if record.exit == 0:  # its exit came before its channel drained
                self._exited(pid, 0)

    def _hello(self, conn: Connection, pid: int, host: str) -> None:
        """A process connected: it gets the job as its rank now, unless it is unknown, gone
        (a new rank of a growth given up: it ends itself) or already here."""
        rank = self.world.started(pid, host) if isinstance(pid, int) else None
        if rank is None or self.records.of(pid).host is not None:
            conn.close()
            return
        record = self.records.of(pid)
        conn.peer = pid
        record.host, record.connection, record.last_heard = host, conn, time.monotonic()
        conn.send(Payload(self.payload, self.collect_all or rank == 0))
        if record.order is not None:  # its world was re-formed before it said hello
            conn.send(record.order)

    def _stall(self, text: str | None, missing: tuple[int, ...], stopping: bool) -> None:
        """Rank 0's engine reports a stall (None: it is over); said on stderr, kept for timeouts.
        When it stops every rank, ask them where they are first."""
        self.stall, self.stuck = text, tuple(missing) if text is not None else ()
        if text is not None:
            print(f"hora: stall: {text}", file=sys.stderr, flush=True)
        if stopping and not self.stopping:
            self.ask_where("the stall inspector stopped them")

    def _output(self, pid: int, stream: str, text: str) -> None:
        record = self.records.of(pid)
        record.tail.append(text.rstrip("\r"))
        rank = self._rank(pid)
        where = f"{rank}@{record.host}" if record.host and self.names_hosts else f"{rank}"
        for callback in self.callbacks:
            callback.on_output(rank, where, stream, text)

    def _exited(self, pid: int, code: int) -> None:
        record = self.records.of(pid)
        record.exit = code
        if self.stopping or record.failure is not None:
            return
        unfinished = not record.returned and record.stopped_at is None
        drained = record.closed or record.host is None
        failure = exit_failure(pid, code, unfinished, drained)
        if failure is not None:
            record.failure = failure
