"""The exceptions a driver sees. Each pickles, so they cross process and Spark boundaries intact."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any


class HoraError(Exception):
    """Base of every error hora raises about a job."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, self.args)


class WorkerFailedError(HoraError, RuntimeError):
    """The job failed: a rank raised, exited non-zero or died. The message leads with the cause.

    A RuntimeError too, as pyspark's TorchDistributor raises one: `except RuntimeError:` around
    its `run()` still catches a failed run.

    `rank` is the rank that failed first, `failed_ranks` every rank seen failing (in the first
    attempt, when the run was restarted). `attempts` holds each failed attempt's own error, in
    order, when `max_restarts` allowed more than one.
    """

    def __init__(
        self,
        message: str,
        rank: int | None = None,
        failed_ranks: Sequence[int] = (),
        attempts: Sequence[WorkerFailedError] = (),
    ):
        super().__init__(message, rank, tuple(failed_ranks), tuple(attempts))
        self.rank = rank
        self.failed_ranks = tuple(failed_ranks)
        self.attempts = tuple(attempts)

    def __str__(self) -> str:
        return str(self.args[0])


class RunTimeoutError(HoraError, TimeoutError):
    """Workers did not all start within `start_timeout`, or the job ran past `timeout`.

    `ranks` are the ranks that had not started (start timeout) or were still running (timeout).
    """

    def __init__(self, message: str, ranks: Sequence[int] = ()):
        super().__init__(message, tuple(ranks))
        self.ranks = tuple(ranks)

    def __str__(self) -> str:
        return str(self.args[0])


class RankTraceback(Exception):
    """A rank's own traceback, set as the cause of the error the driver raises: a terminal or a
    notebook then shows the user's frames and exception first, hora's story after them."""

    def __init__(self, rank: int, text: str, exception: bytes | None = None):
        super().__init__(rank, text, exception)
        self.rank = rank
        self.text = text
        self.exception = exception

    def __str__(self) -> str:
        return f"rank {self.rank} raised:\n{self.text.rstrip()}"

    def original(self) -> BaseException | None:
        """The rank's exception itself (its type and arguments), where it came back pickled."""
        if self.exception is None:
            return None
        try:
            found = pickle.loads(self.exception)
        except Exception:
            return None
        return found if isinstance(found, BaseException) else None


class UnpicklableError(HoraError, TypeError):
    """The training function, its arguments or its return value cannot be pickled."""
