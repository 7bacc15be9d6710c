"""The Spark engine's options (`engine_options=`), checked without importing pyspark.

The doors use them to keep their originals' meanings: spark-tensorflow-distributor's GPU
resource name and its split of `num_slots` GPUs over the tasks, and each original's own Spark
setting for running unencrypted on a TLS cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: hora's own opt-in to unencrypted training on a cluster with spark.ssl.enabled, for every run
HORA_IGNORE_SSL = "spark.hora.ignoreSsl"
#: pyspark's TorchDistributor's, honoured by default (Runner, hora.run, TorchDistributor)
TORCH_IGNORE_SSL = "pytorch.spark.distributor.ignoreSsl"

OPTIONS = {
    "gpu_resource": "the Spark resource name of the tasks' GPUs (default 'gpu'): "
    "spark.task.resource.<name>.amount, TaskContext.resources()[<name>]",
    "task_gpu_counts": "how many of its GPUs the task of each partition gives its rank (a list, "
    "one count per task); each rank then sees only those. Default: all of them, and with one GPU "
    "per task a rank sees the GPUs of the job's ranks on its host",
    "ignore_ssl_key": "the Spark setting that, set to 'true', lets the run train unencrypted on a "
    f"cluster with spark.ssl.enabled, besides {HORA_IGNORE_SSL} (default {TORCH_IGNORE_SSL!r})",
}


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    resource = options.get("gpu_resource", "gpu")
    if not isinstance(resource, str) or not resource:
        raise ValueError(f"gpu_resource must be a Spark resource name, got {resource!r}")
    counts = options.get("task_gpu_counts")
    if counts is not None:
        if not isinstance(counts, list | tuple) or not all(
            isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts
        ):
            raise ValueError(f"task_gpu_counts must be a list of counts >= 0, got {counts!r}")
        counts = list(counts)
    key = options.get("ignore_ssl_key", TORCH_IGNORE_SSL)
    if not isinstance(key, str) or not key:
        raise ValueError(f"ignore_ssl_key must be a Spark setting's name, got {key!r}")
    return {"gpu_resource": resource, "task_gpu_counts": counts, "ignore_ssl_key": key}


def task_gpu_counts(counts: list[int] | None, np: int) -> list[int] | None:
    """The checked `task_gpu_counts` option of an attempt of `np` tasks: one count per task."""
    if counts is not None and len(counts) != np:
        raise ValueError(f"task_gpu_counts needs one count per task ({np}), got {counts!r}")
    return counts
