"""The Spark engine's capacity (`Engine.capacity`): how many ranks the cluster could run now,
by which an elastic run (min_np/max_np) sizes itself."""

from __future__ import annotations

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
