"""An attempt's states: one enum for its controller (`hora.job.attempt`) and its world.

After torch elastic's `WorkerState` and Ray Train v2's controller states. The attempt is in one
of them at a time (`AttemptController.state`); its world (`hora.job.world.World.phase`, the
membership's part) moves through STARTING, RUNNING, SHRINKING, GROWING, FAILING and STOPPING,
and the attempt shows the world's SHRINKING and GROWING while its ranks run.
"""

from __future__ import annotations

import enum


class AttemptState(enum.Enum):
    """Where one attempt is; the last five end it."""

    #: the group runs; not every rank has connected yet (the world: not every rank has said
    #: whether its hvd.elastic.run can re-form in place)
    STARTING = "starting"
    RUNNING = "running"  # every rank has the job; results are due
    SHRINKING = "shrinking"  # the survivors of a loss were told their places; until rank 0 says
    GROWING = "growing"  # new ranks start; once all wait, every rank re-forms with them
    FINISHING = "finishing"  # every result is in; the ranks get their grace to exit
    #: a rank failed: its story waits for the cause and the ranks' stacks (the world: it cannot
    #: go on in place; the driver restarts every rank)
    FAILING = "failing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed out"
    RESIZED = "resized"  # every rank stopped at a commit so that the run can grow
    STOPPING = "stopping"  # the group was stopped: what the ranks said last is drained

    @property
    def ended(self) -> bool:
        return self in _ENDED


_ENDED = frozenset(
    {
        AttemptState.SUCCEEDED,
        AttemptState.FAILED,
        AttemptState.TIMED_OUT,
        AttemptState.RESIZED,
        AttemptState.STOPPING,
    }
)
