"""A user's driver script, run as `.venv/bin/python _clean_driver.py BARE_PYTHON` by
test_executor_python.py with a clean environment: PYSPARK_PYTHON unset and a `python3` on the
PATH (BARE_PYTHON) that has neither hora nor cloudpickle nor torch.

1. local[2] with Spark's default executors' Python: hora.run must work (the driver's interpreter).
2. local[2] with PYSPARK_PYTHON=BARE_PYTHON: the same.
3. local[2] with PYSPARK_PYTHON=BARE_PYTHON and spark.hora.executorPython=spark (what every
   non-local master gets): hora.run must stop before any rank runs, with hora's message.

Prints one line `RESULT <json>` for the test to judge.
"""

from __future__ import annotations

import json
import os
import sys

from pyspark.sql import SparkSession

import hora


def start(master: str, **conf: str) -> SparkSession:
    builder = (
        SparkSession.Builder()
        .master(master)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", "ERROR")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def spark_python(_partition):
    """What Spark's own jobs run on: the executors' Python as Spark chose it."""
    import sys

    yield sys.executable


def rank_and_python() -> tuple[str, str]:
    import os
    import sys

    return os.environ["RANK"], sys.executable


def main(bare_python: str) -> None:
    out: dict[str, object] = {"driver": sys.executable}

    spark = start("local[2]")
    sc = spark.sparkContext
    out["spark_default"] = sc.parallelize([0], 1).mapPartitions(spark_python).collect()[0]
    out["ranks"] = hora.run(rank_and_python, np=2)
    spark.stop()

    os.environ["PYSPARK_PYTHON"] = bare_python
    spark = start("local[2]")
    out["ranks_despite_pyspark_python"] = hora.run(rank_and_python, np=2)
    spark.stop()

    spark = start("local[2]", **{"spark.hora.executorPython": "spark"})
    out["spark_chosen"] = (
        spark.sparkContext.parallelize([0], 1).mapPartitions(spark_python).collect()[0]
    )
    try:
        out["mismatch"] = {"returned": hora.run(rank_and_python, np=2)}
    except hora.WorkerFailedError as exc:
        out["mismatch"] = {"message": str(exc), "rank": exc.rank}
    spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
