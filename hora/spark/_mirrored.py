"""`MirroredStrategyRunner`: spark-tensorflow-distributor's API on hora's engines.

`run(train_fn, **kwargs)` runs `train_fn` on `num_slots` ranks as one Spark barrier stage (or,
with `local_mode=True`, in one process on the driver) under
`tf.distribute.MultiWorkerMirroredStrategy().scope()`, and returns rank 0's value. Logs,
failures, timeouts and GPUs are hora's, as for TorchDistributor jobs.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from hora import environment
from hora.config import RunConfig
from hora.engines.spark.session import active_spark_context
from hora.job import launch
from hora.spark._distributor import _driver_gpus

__all__ = ["MirroredStrategyRunner"]


class MirroredStrategyRunner:
    """spark_tensorflow_distributor.MirroredStrategyRunner's contract on hora.

    `num_slots`: GPUs (with `use_gpu`) or CPU tasks to use. `local_mode`: run on the driver in
    one process (CPU: one slot only, as the original). `use_gpu`: give each task its Spark GPU
    resources `gpu_resource_name`; the task count is then `ceil(num_slots /
    spark.task.resource.<name>.amount)`. `use_custom_strategy`: call `train_fn` as it is (it
    builds its own strategy) instead of inside `MultiWorkerMirroredStrategy().scope()`.
    """

    def __init__(
        self,
        *,
        num_slots: int,
        local_mode: bool = False,
        use_gpu: bool = True,
        gpu_resource_name: str = "gpu",
        use_custom_strategy: bool = False,
        min_np: int | None = None,
        max_np: int | None = None,
    ) -> None:
        if min_np is not None or max_np is not None:
            raise ValueError(
                "MirroredStrategyRunner cannot run an elastic job (min_np/max_np): "
                "MultiWorkerMirroredStrategy's TF_CONFIG names every worker for the whole run. "
                "Use HorovodRunner with hora.tensorflow.keras.elastic (docs/elastic.md)"
            )
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots <= 0:
            raise ValueError(f"num_slots has to be a positive integer, got {num_slots!r}")
        self.num_slots = num_slots
        self.local_mode = bool(local_mode)
        self.use_gpu = bool(use_gpu)
        self.gpu_resource_name = gpu_resource_name
        self.use_custom_strategy = bool(use_custom_strategy)
        if self.local_mode and not self.use_gpu and num_slots > 1:
            raise ValueError(
                "local_mode=True with use_gpu=False runs one process on the driver: num_slots "
                f"must be 1, got {num_slots} (use local_mode=False for several CPU tasks)"
            )

    def get_num_tasks(self) -> int:
        """How many Spark tasks: `num_slots` on CPU; on GPU, as many as the slots need."""
        if not self.use_gpu:
            return self.num_slots
        key = f"spark.task.resource.{self.gpu_resource_name}.amount"
        amount = _spark_conf(key)
        if amount is None:
            raise ValueError(
                f"use_gpu=True needs {key} in the Spark configuration (GPUs per task); set it, "
                "or pass use_gpu=False"
            )
        per_task = int(float(amount))
        if per_task < 1:
            raise ValueError(f"{key} must be at least 1, got {amount}")
        return math.ceil(self.num_slots / per_task)

    def run(self, train_fn: Callable[..., Any], **kwargs: Any) -> Any:
        """Run `train_fn(**kwargs)` on every rank under the strategy; return rank 0's value."""
        if not callable(train_fn):
            raise TypeError(f"train_fn must be callable, got {type(train_fn).__name__}")
        job = (train_fn, kwargs, self.use_custom_strategy)
        if self.local_mode:
            env: dict[str, str] = {}
            if self.use_gpu:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(_driver_gpus(self.num_slots))
            config = RunConfig(np=1, backend="local", env=env, collect_all=False)
            return launch(_train, job, {}, config)[0]
        _require_spark_session()
        config = RunConfig(
            np=self.get_num_tasks(), backend="spark", use_gpu=self.use_gpu, collect_all=False
        )
        return launch(_train, job, {}, config)[0]


def _require_spark_session() -> None:
    if active_spark_context() is None:
        raise RuntimeError(
            "MirroredStrategyRunner(local_mode=False) runs its workers as Spark tasks and needs "
            "an active SparkSession: create one first (SparkSession.builder...getOrCreate()), "
            "or pass local_mode=True to run on the driver"
        )


def _spark_conf(key: str) -> str | None:
    context = active_spark_context()
    return None if context is None else context.getConf().get(key, None)


# ----- inside each rank ---------------------------------------------------------------------------
def _train(train_fn: Callable[..., Any], kwargs: dict[str, Any], custom: bool) -> Any:
    with tf_config():
        if custom:
            return train_fn(**kwargs)
        import tensorflow as tf

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            return train_fn(**kwargs)


@contextlib.contextmanager
def tf_config() -> Iterator[dict[str, Any] | None]:
    """Set TF_CONFIG for this rank's worker of a MultiWorkerMirroredStrategy cluster.

    No port race: spark-tensorflow-distributor binds a port, closes it and hopes TensorFlow
    gets it. Here each rank binds its port with SO_REUSEADDR and keeps that socket, unlistened,
    until `train_fn` returns: no other process is handed the port (ephemeral allocation and
    plain binds skip a bound port), while TensorFlow's gRPC server, which also sets
    SO_REUSEADDR, may bind and listen on it (Linux allows that while no socket listens there).
    The endpoints are agreed through the run's rendezvous store (the TCPStore every rank's
    MASTER_ADDR:MASTER_PORT names), keyed by the attempt so a restart never reads stale ones.
    """
    here = environment.current()
    rank, size = here.rank or 0, here.size or 1
    if size == 1:  # one worker: TensorFlow needs no cluster
        yield None
        return
    master, master_port = here.master_addr, here.master_port
    if master is None or master_port is None:
        raise RuntimeError(f"rank {rank} of {size} has no MASTER_ADDR/MASTER_PORT to meet at")
    reservation = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    reservation.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        reservation.bind(("", 0))
        endpoint = f"{_reachable_address(master, master_port)}:{reservation.getsockname()[1]}"
        workers = _exchange(master, master_port, rank, size, endpoint, here.attempt)
        config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}
        os.environ["TF_CONFIG"] = json.dumps(config)
        yield config
    finally:
        reservation.close()


def _reachable_address(master: str, port: int) -> str:
    """This host's address on the interface that reaches the rendezvous host (the peers reach
    us the same way); 127.0.0.1 when the master is local."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((master, port))  # UDP: no packet is sent
        return str(probe.getsockname()[0])
    finally:
        probe.close()


def _exchange(
    master: str, port: int, rank: int, size: int, endpoint: str, attempt: int
) -> list[str]:
    import torch.distributed as dist

    store = dist.TCPStore(master, port, is_master=False, timeout=timedelta(seconds=300))
    prefix = f"hora/tf_config/{attempt}/"
    store.set(f"{prefix}{rank}", endpoint)
    keys = [f"{prefix}{r}" for r in range(size)]
    store.wait(keys)
    return [store.get(k).decode() for k in keys]
