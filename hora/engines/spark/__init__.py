"""The Spark engine: one barrier stage of `np` tasks on the active SparkSession, one rank per task.

- `launcher`: the launcher on the driver (the stage, the supervisors' rendezvous, stopping).
- `capacity`: how many ranks the cluster could run now (an elastic run's sizing).
- `session`: the active session, classic or Spark Connect (`Session`: what the engine needs of
  it), and the one `hora run --backend spark` starts.
- `classic`, `connect`: the stage on each kind of session (an RDD barrier stage; a barrier
  `mapInArrow`), its slots, tags and cancel.
- `entry`: the first code a task runs (shipped by value): is this executor's Python the driver's,
  can it reach the driver?
- `task`: the rest of a task: register, wait for the plan, supervise the rank's worker.
- `checks`: what is checked on the driver before a stage starts (slots, SSL, Python, GPUs).
- `failures`: a failed stage read back as the task that failed and why.
- `options`: the engine's options (GPU resource, GPUs per task, the SSL opt-in setting).
- `task_context`: pyspark's BarrierTaskContext inside a rank, served by the rank's task (the
  engine's `rank_setup`).

This `__init__` is the engine's one public face: pyspark's doors (`hora.spark`) import what they
need of the engine from here, never its modules.
"""

from hora.engines import Engine
from hora.engines.spark.base import Session
from hora.engines.spark.checks import concurrent_slots, gpu_amount_key
from hora.engines.spark.classic import ClassicSession
from hora.engines.spark.connect import ConnectSession
from hora.engines.spark.options import OPTIONS, TORCH_IGNORE_SSL, check_options
from hora.engines.spark.session import active_session

__all__ = [
    "ENGINE",
    "TORCH_IGNORE_SSL",
    "ClassicSession",
    "ConnectSession",
    "Session",
    "active_session",
    "concurrent_slots",
    "gpu_amount_key",
]

ENGINE = Engine(
    name="spark",
    is_active=lambda: active_session() is not None,
    launcher="hora.engines.spark.launcher:SparkLauncher",
    options=OPTIONS,
    check_options=check_options,
    cli_session="hora.engines.spark.session:cli_session",
    session_options=("remote",),
    capacity="hora.engines.spark.capacity:capacity",
    rank_setup="hora.engines.spark.task_context:rank_setup",
    summary="one barrier stage on a SparkSession (built from spark-defaults / PYSPARK_SUBMIT_ARGS, "
    "or a Spark Connect session with --remote / SPARK_REMOTE)",
)
