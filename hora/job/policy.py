"""Whether a failed attempt is restarted or ends the run (torchrun's `--max-restarts` rule).

Kept apart from the monitor so the rule can be read in one place and tested without processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hora.errors import HoraError, WorkerFailedError

#: the policy's word on a failed attempt (the world's own are `hora.job.world.Decision`)
Verdict = Literal["restart", "fail"]


@dataclass(frozen=True)
class FailurePolicy:
    """Restart a failed group while fewer than `max_restarts` restarts were spent.

    Only worker failures (a rank raised, exited or died, a Spark task or executor was lost) are
    restarted. A timeout is not: a run that hangs or cannot get its slots would hang or wait
    again, and `timeout` bounds the whole run, not one attempt.
    """

    max_restarts: int = 0

    def decide(self, error: HoraError, failed_attempts: int) -> Verdict:
        """`failed_attempts` counts the attempts that failed so far, this one included."""
        if not isinstance(error, WorkerFailedError):
            return "fail"
        return "restart" if failed_attempts <= self.max_restarts else "fail"
