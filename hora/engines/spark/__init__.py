"""The Spark engine: one barrier stage of `np` tasks on the active SparkSession, one rank per task.

- `engine`: the launcher on the driver (the stage, the supervisors' rendezvous, stopping).
- `entry`: the first code a task runs (shipped by value): is this executor's Python the driver's?
- `task`: the rest of a task: register, wait for the plan, supervise the rank's worker.
- `checks`: what is checked on the driver before a stage starts (slots, SSL, Python, GPUs).
- `failures`: a failed stage read back as the task that failed and why.
- `session`: the active SparkSession, and the one `hora run --backend spark` starts.
"""

from hora.engines import Engine
from hora.engines.spark.session import active_spark_context

ENGINE = Engine(
    name="spark",
    is_active=lambda: active_spark_context() is not None,
    launcher="hora.engines.spark.engine:SparkLauncher",
    cli_session="hora.engines.spark.session:cli_session",
    capacity="hora.engines.spark.engine:capacity",
    summary="one barrier stage on a SparkSession (built from spark-defaults / PYSPARK_SUBMIT_ARGS)",
)
