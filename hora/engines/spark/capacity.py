"""The Spark engine's capacity (`Engine.capacity`): how many ranks the cluster could run now,
by which an elastic run (min_np/max_np) sizes itself."""

from __future__ import annotations

import threading

from hora.engines import AttemptSpec
from hora.engines.spark import checks as _spark_checks
from hora.engines.spark.session import active_session


def capacity(spec: AttemptSpec, held: int) -> int:
    """The task slots of the live executors (Spark's own count, busy slots included, so `held`
    is in it already): how many ranks a barrier stage could have now."""
    session = active_session()
    if session is None:
        return 0
    if session.kind == "connect":
        raise ValueError(
            "an elastic run (min_np/max_np) sizes itself by the cluster's free task slots, which "
            "a Spark Connect client cannot count; run it from a classic SparkSession, or use "
            "max_restarts"
        )
    return _spark_checks.concurrent_slots(session, spec.options["gpu_resource"]) or 0


class TaskTally:
    """The tasks (slots) of an elastic run whose Spark job still runs, and whether one failed
    or was retried: whether Spark's count of slots is true now (`Launcher.slots_settled`).

    A rank killed under its live task ends that task by itself (its supervisor returns once
    its worker is gone): its slot is free on an executor Spark still has. A task that failed
    or was retried (a lost executor, which may take a moment to leave the count or be
    replaced) or still runs (a silent host's) keeps the settle time: a growth could otherwise
    wait start_timeout for a slot that is not there."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[int] = set()
        self._lost = False

    def started(self, slot: int) -> None:
        with self._lock:
            self._running.add(slot)

    def ended(self, slot: int, failed: bool = False) -> None:
        with self._lock:
            self._running.discard(slot)
            self._lost = self._lost or failed

    def retried(self) -> None:
        """Spark tried a task again: its first try failed (its executor lost?)."""
        with self._lock:
            self._lost = True

    def settled(self, held: int) -> bool:
        with self._lock:
            return not self._lost and len(self._running) == held
