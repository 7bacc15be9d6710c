"""The story of a failed attempt: which rank failed first and why, its traceback and last
output, what failed after it; the rank's own traceback as the error's cause, so it prints first."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hora.engines.process import describe_exit
from hora.errors import RankTraceback, RunTimeoutError, WorkerFailedError


@dataclass
class Failure:
    rank: int
    summary: str
    traceback: str
    reported: bool  # True when the worker described its own failure
    time: float
    subject: str = ""  # the headline's start when what failed is not the rank itself (a task)
    exception: bytes | None = None  # the rank's exception, pickled (Error.exception)
    #: the engine saw what ran the rank end under it (EngineFailed: a Ray actor, a Spark task)
    by_engine: bool = False

    def headline(self) -> str:
        return f"{self.subject or f'rank {self.rank} failed'}: {self.summary}"


def exit_failure(rank: int, code: int, unfinished: bool, drained: bool) -> Failure | None:
    """How a rank's process ending with `code` before a word of its own fails the attempt: a
    non-zero code always; a clean one without the rank's last word (`unfinished`), once its
    channel has drained (a result still in flight arrives before the channel's close)."""
    if code != 0:
        return Failure(rank, describe_exit(code), "", False, time.time())
    if unfinished and drained:
        said = "exited with status 0 before returning a result (os._exit?)"
        return Failure(rank, said, "", False, time.time())
    return None


def story(
    failures: Mapping[int, Failure], tails: Mapping[int, Iterable[str]], stacks: str | None
) -> WorkerFailedError:
    """The attempt's error from its failures, each rank's last output lines and, when the ranks
    were asked where they are, their stacks."""
    # A silent death (signal, exit without a word) makes the other ranks' collectives fail
    # moments later, so it is the likelier root cause; then the earliest report wins.
    ordered = sorted(failures.values(), key=lambda f: (f.reported, f.time))
    root = ordered[0]
    lines = [root.headline()]
    if root.traceback:
        lines += ["", root.traceback.rstrip()]
    tail = list(tails[root.rank])
    if tail:
        lines += ["", f"last {len(tail)} lines of rank {root.rank}'s output:"]
        lines += [f"  | {line}" for line in tail]
    others = ordered[1:]
    if others:
        lines += ["", "also failed, after it:"]
        lines += [f"  {f.subject or f'rank {f.rank}'}: {f.summary}" for f in others]
    if stacks is not None:
        lines += ["", stacks]
    error = WorkerFailedError("\n".join(lines), root.rank, [f.rank for f in ordered])
    if root.reported and root.traceback:  # printed first: the user's frames lead
        error.__cause__ = RankTraceback(root.rank, root.traceback, root.exception)
    return error


def not_started(missing: list[int], np: int, start_timeout: float) -> RunTimeoutError:
    """Ranks `missing` of `np` never connected within start_timeout."""
    return RunTimeoutError(
        f"{len(missing)} of {np} workers did not start within start_timeout={start_timeout:g} s: "
        f"ranks {_ranks(missing)} never connected to the driver. Check that the cluster has free "
        "slots and that workers can reach the driver, or raise start_timeout.",
        missing,
    )


def past_timeout(
    running: list[int], timeout: float | None, stall: str | None, where: str | None
) -> RunTimeoutError:
    """The run passed its `timeout` with ranks `running` not done: their stall, their stacks."""
    stalled = f"\nThey were stalled: {stall}" if stall else ""
    stacks = f"\n\n{where}" if where is not None else ""
    return RunTimeoutError(
        f"the job ran past timeout={timeout or 0:g} s and was stopped; ranks {_ranks(running)} had "
        f"not finished.{stalled}{stacks}",
        running,
    )


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))
