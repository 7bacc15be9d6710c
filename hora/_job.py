"""The driver's side of one run: hand out the job, relay logs, collect results, judge failures.

Engine-agnostic: a launcher starts workers and reports their output and exits as events; the
workers report over the authenticated channel. Everything arrives on one queue and is handled on
the caller's thread, so logs print in order, in the caller's cell, and nothing prints after
`run` returns.
"""

from __future__ import annotations

import queue
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import cloudpickle

from hora import _channel, environment
from hora._output_files import OutputFiles
from hora.config import RunConfig
from hora.errors import RunTimeoutError, WorkerFailedError
from hora.launchers import LaunchContext, Launcher
from hora.timeline._driver import DriverTimeline

TAIL_LINES = 30
SETTLE_SECONDS = 0.3  # after a first failure, wait this long for its cause to be reported too
EXIT_GRACE_SECONDS = 10.0  # after every result is in, how long ranks get to exit by themselves


@dataclass
class Failure:
    rank: int
    summary: str
    traceback: str
    reported: bool  # True when the worker described its own failure
    time: float
    subject: str = ""  # the headline's start when what failed is not the rank itself (a task)

    def headline(self) -> str:
        return f"{self.subject or f'rank {self.rank} failed'}: {self.summary}"


class Job:
    """One run of a pickled job on a launcher. `run()` returns the pickled results by rank."""

    def __init__(self, config: RunConfig, payload: bytes, launcher: Launcher, collect_all: bool):
        self.config = config
        self.payload = payload
        self.launcher = launcher
        self.collect_all = collect_all
        self.events: queue.Queue = queue.Queue()
        self.started: dict[int, str] = {}  # rank -> host
        self.results: dict[int, Any] = {}
        self.exits: dict[int, int] = {}
        self.closed: set[int] = set()  # ranks whose worker channel has closed (fully read)
        self.failures: dict[int, Failure] = {}
        self.tails: dict[int, deque[str]] = {r: deque(maxlen=TAIL_LINES) for r in range(config.np)}
        self.stopping = False
        self.timeline = DriverTimeline()  # ranks send ("timeline", rank, path, events)
        self.output_files: OutputFiles | None = None
        self.stall: str | None = None  # rank 0's standing stall warning (hora.torch._stall)

    def run(self) -> list[Any]:
        if self.config.output_filename:  # before anything starts: a bad folder is a ValueError
            self.output_files = OutputFiles(self.config.output_filename, self.config.np)
        secret = _channel.new_secret()
        server = _channel.Server(secret, self.events, host=self.launcher.channel_host)
        env = environment.driver_env() | dict(self.config.env)
        ctx = LaunchContext(self.config.np, server.address, secret, self.events, env)
        try:
            self.launcher.start(ctx)
            self._monitor()
        finally:
            self.stopping = True
            self.launcher.stop()
            server.close()
            self._drain()
            self.timeline.close()
            if self.output_files is not None:
                self.output_files.close()
        return [
            None if self.results[r] is None else cloudpickle.loads(self.results[r])
            for r in range(self.config.np)
        ]

    # -- the loop ---------------------------------------------------------------------------
    def _monitor(self) -> None:
        np = self.config.np
        t0 = time.monotonic()
        start_deadline = t0 + self.config.start_timeout
        deadline = t0 + self.config.timeout if self.config.timeout else None
        all_done_at: float | None = None
        while True:
            now = time.monotonic()
            if self.failures:
                first = min(f.time for f in self.failures.values())
                if time.time() - first >= SETTLE_SECONDS:
                    raise self._failure_error()
            elif len(self.results) == np:
                all_done_at = all_done_at or now
                if len(self.exits) == np or now - all_done_at > EXIT_GRACE_SECONDS:
                    return
            if len(self.started) < np and now > start_deadline:
                missing = [r for r in range(np) if r not in self.started]
                raise RunTimeoutError(
                    f"{len(missing)} of {np} workers did not start within start_timeout="
                    f"{self.config.start_timeout:g} s: ranks {_ranks(missing)} never connected "
                    "to the driver. Check that the cluster has free slots and that workers can "
                    "reach the driver, or raise start_timeout.",
                    missing,
                )
            if deadline is not None and now > deadline:
                running = [r for r in range(np) if r not in self.results]
                stall = f"\nThey were stalled: {self.stall}" if self.stall else ""
                raise RunTimeoutError(
                    f"the job ran past timeout={self.config.timeout:g} s and was stopped; "
                    f"ranks {_ranks(running)} had not finished.{stall}",
                    running,
                )
            try:
                conn, message = self.events.get(timeout=0.05)
            except queue.Empty:
                continue
            self._handle(conn, message)

    def _handle(self, conn: _channel.Connection | None, message: tuple | None) -> None:
        if message is None:  # a channel closed; the launcher reports the process's exit
            rank = getattr(conn, "peer", None)
            if rank is not None:
                self.closed.add(rank)
                if self.exits.get(rank) == 0:  # its exit was reported before its channel drained
                    self._exited(rank, 0)
            return
        kind, *body = message
        if kind == "hello":
            assert conn is not None  # a hello only ever arrives on a worker's channel
            rank, _pid, host = body
            if not (isinstance(rank, int) and 0 <= rank < self.config.np) or rank in self.started:
                conn.close()
                return
            conn.peer = rank
            self.started[rank] = host
            want = self.collect_all or rank == 0
            conn.send(("payload", self.payload, want))
        elif kind == "output":
            self._output(*body)
        elif kind == "result":
            rank, data = body
            self.results[rank] = data
        elif kind == "error":
            info = body[0]
            self.failures[info["rank"]] = Failure(
                info["rank"], info["summary"], info["traceback"], True, info["time"]
            )
        elif kind == "exit":
            self._exited(*body)
        elif kind == "engine_failed":
            rank, summary, detail, *subject = body
            failure = Failure(rank, summary, detail, False, time.time(), *subject)
            self.failures.setdefault(rank, failure)
        elif kind == "timeline":
            self.timeline.receive(*body)
        elif kind == "stall":
            self._stall(*body)

    def _stall(self, text: str | None) -> None:
        """Rank 0's engine reports a stall (None: it is over); said on stderr, kept for timeouts."""
        self.stall = text
        if text is not None:
            print(f"hora: stall: {text}", file=sys.stderr, flush=True)

    def _output(self, rank: int, stream: str, text: str) -> None:
        self.tails[rank].append(text)
        if self.output_files is not None:
            self.output_files.write(rank, stream, text)
        if self.config.driver_log_verbosity == "log_callback_only" and stream != "log":
            return
        host = self.started.get(rank)
        where = f"{rank}@{host}" if host and self.launcher.multi_host else f"{rank}"
        out = sys.stderr if stream == "stderr" else sys.stdout
        print(f"[{where}] {text}", file=out, flush=True)

    def _exited(self, rank: int, code: int) -> None:
        self.exits[rank] = code
        if self.stopping or rank in self.failures:
            return
        if code != 0:
            self.failures[rank] = Failure(rank, describe_exit(code), "", False, time.time())
        elif rank not in self.results and (rank in self.closed or rank not in self.started):
            # A result still in flight on the channel arrives before the channel's close, so a
            # clean exit without a result is judged only once the channel has drained.
            self.failures[rank] = Failure(
                rank,
                "exited with status 0 before returning a result (os._exit?)",
                "",
                False,
                time.time(),
            )

    def _drain(self) -> None:
        """Print what was said before the workers were stopped; nothing is lost at exit."""
        while True:
            try:
                _conn, message = self.events.get_nowait()
            except queue.Empty:
                return
            if message and message[0] == "output":
                self._output(*message[1:])
            elif message and message[0] == "timeline":
                self.timeline.receive(*message[1:])
            elif message and message[0] == "stall":
                self._stall(*message[1:])

    # -- the story of a failure -------------------------------------------------------------
    def _failure_error(self) -> WorkerFailedError:
        # A silent death (signal, exit without a word) makes the other ranks' collectives fail
        # moments later, so it is the likelier root cause; then the earliest report wins.
        ordered = sorted(self.failures.values(), key=lambda f: (f.reported, f.time))
        root = ordered[0]
        lines = [root.headline()]
        if root.traceback:
            lines += ["", root.traceback.rstrip()]
        tail = list(self.tails[root.rank])
        if tail:
            lines += ["", f"last {len(tail)} lines of rank {root.rank}'s output:"]
            lines += [f"  | {line}" for line in tail]
        others = ordered[1:]
        if others:
            lines += ["", "also failed, after it:"]
            lines += [f"  {f.subject or f'rank {f.rank}'}: {f.summary}" for f in others]
        return WorkerFailedError("\n".join(lines), root.rank, [f.rank for f in ordered])


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {-code} ({name})"
    return f"exited with status {code}"


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))
