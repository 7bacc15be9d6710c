"""Real local Spark for the DeepSpeed door, ended with these tests (as tests/spark's are)."""

from tests.spark.conftest import (  # noqa: F401  (fixtures, autouse)
    no_worker_survives_spark,
    spark_jvm_ends_with_these_tests,
)
