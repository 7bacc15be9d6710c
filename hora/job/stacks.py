"""Asking every rank where it is, and telling the user: the stuck ranks' stacks first.

The driver asks (a `DumpStacks` on each rank's channel) when a run times out, when the stall
inspector stops every rank, and when the user asks (`hora run` gets SIGUSR1); each rank answers
from a thread of its own (`hora.rank.stacks`). A rank that cannot answer within a few seconds is
named as such: it has finished, or it holds the GIL in native code.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Collection, Iterable, Mapping

from hora.wire.channel import Connection
from hora.wire.protocol import DumpStacks

ANSWER_SECONDS = 3.0
#: the signal that makes `hora run` print where every rank is, and go on
DUMP_SIGNAL = signal.SIGUSR1
_wanted = threading.Event()


def request_dump() -> None:
    """Ask the runs of this process to print where every rank is (safe in a signal handler)."""
    _wanted.set()


def take_request() -> bool:
    """Whether a dump was asked for since the last call."""
    if not _wanted.is_set():
        return False
    _wanted.clear()
    return True


class StackRequest:
    """One round of "where are you?" to every connected rank, and their answers."""

    def __init__(self, connections: Mapping[int, Connection], why: str):
        self.why = why
        self.asked = set(connections)
        self.answers: dict[int, str] = {}
        self.deadline = time.monotonic() + ANSWER_SECONDS
        for conn in connections.values():
            with contextlib.suppress(OSError):  # a rank that just went away cannot answer
                conn.send(DumpStacks())

    def answer(self, rank: int, text: str) -> None:
        if rank in self.asked:
            self.answers[rank] = text

    def complete(self, now: float | None = None) -> bool:
        """Every rank asked has answered, or the time to answer is over."""
        now = time.monotonic() if now is None else now
        return len(self.answers) == len(self.asked) or now >= self.deadline

    def report(
        self,
        stuck: Iterable[int] = (),
        hosts: Mapping[int, str] | None = None,
        ended: Collection[int] = (),
    ) -> str:
        """Every asked rank's answer, the `stuck` ranks first, then by rank; `ended`: ranks that
        had failed, exited or returned when asked."""
        stuck = [r for r in stuck if r in self.asked]
        order = stuck + sorted(self.asked - set(stuck))
        lead = ""
        if stuck:
            which = "rank" if len(stuck) == 1 else "ranks"
            lead = f" ({which} {', '.join(map(str, stuck))} first: the stall waits for them)"
        lines = [f"where each rank was when {self.why}{lead}:"]
        for rank in order:
            host = (hosts or {}).get(rank)
            title = f"rank {rank}" + (f" on {host}" if host else "")
            text = self.answers.get(rank)
            if text is not None:
                lines.append(f"{title}: " + text.replace("\n", "\n    "))
            elif rank in ended:
                lines.append(f"{title}: had ended before it could answer")
            else:
                lines.append(
                    f"{title}: no answer within {ANSWER_SECONDS:g} s (its process may hold the "
                    "GIL in native code)"
                )
        return "\n".join(lines)


class Questions:
    """One attempt's questions to its ranks: the one its end waits for (`dump`, whose answers
    go in the story: asked at a timeout or when the stall inspector stops the ranks), and the
    user's (SIGUSR1: printed, and the run goes on)."""

    def __init__(self) -> None:
        self.dump: StackRequest | None = None
        self.by_user: StackRequest | None = None

    def ask(self, connections: Mapping[int, Connection], why: str) -> None:
        """Ask every rank in `connections` where it is, for the story (once an attempt)."""
        if self.dump is None:
            self.dump = StackRequest(connections, why)

    def answered(self, now: float) -> bool:
        """No question the story waits for is pending (it waits a few seconds for answers)."""
        return self.dump is None or self.dump.complete(now)

    def answer(self, rank: int, text: str) -> None:
        for request in (self.dump, self.by_user):
            if request is not None:
                request.answer(rank, text)

    def serve_user(self, connections: Mapping[int, Connection]) -> StackRequest | None:
        """Ask the ranks when the user asked since the last call; the user's request once
        every rank answered (the caller prints it), else None."""
        if take_request() and self.by_user is None:
            self.by_user = StackRequest(connections, "you asked (SIGUSR1)")
        request = self.by_user
        if request is not None and request.complete():
            self.by_user = None
            return request
        return None
