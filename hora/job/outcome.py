"""What an attempt may take (`Limits`), and how it ended: what its monitor returns to the
driver, which decides what follows.

An outcome is a value, not an exception: the driver matches on it (finish the run, judge a
failure by its policy, grow into a larger attempt), and only its own errors propagate.
"""

from __future__ import annotations

from dataclasses import dataclass

from hora.errors import RunTimeoutError, WorkerFailedError


@dataclass(frozen=True, kw_only=True)
class Ended:
    """What every outcome says of the attempt as it ended: its ranks (fewer after a shrink in
    place) and, on several hosts, each rank's host."""

    np: int
    hosts: dict[int, str]


@dataclass(frozen=True, kw_only=True)
class Finished(Ended):
    """Every rank returned: their pickled results by rank."""

    results: dict[int, bytes | None]


@dataclass(frozen=True, kw_only=True)
class Failed(Ended):
    """A rank failed and the world could not go on without it: the story."""

    error: WorkerFailedError


@dataclass(frozen=True, kw_only=True)
class TimedOut(Ended):
    """Ranks did not start in time, or the run passed its timeout."""

    error: RunTimeoutError


@dataclass(frozen=True, kw_only=True)
class StoppedToGrow(Ended):
    """Every rank stopped at `commit` so that the run can grow by a restart."""

    commit: int


Outcome = Finished | Failed | TimedOut | StoppedToGrow


@dataclass(frozen=True)
class Limits:
    """When an attempt must give up: absolute `time.monotonic()` deadlines."""

    start_timeout: float  # seconds for every rank of this attempt to connect
    timeout: float | None  # the run's whole `timeout`, for the message
    deadline: float | None  # when the run's `timeout` runs out (across attempts)
