"""`MirroredStrategyRunner`: spark-tensorflow-distributor's API on hora's engines.

`run(train_fn, **kwargs)` runs `train_fn` on one rank per Spark task as one barrier stage (or,
with `local_mode=True`, in one process on the driver) under
`tf.distribute.MultiWorkerMirroredStrategy().scope()`, and returns rank 0's value. Logs,
failures, timeouts and the TaskContext inside the rank are hora's, as for TorchDistributor jobs.

The original (spark_tensorflow_distributor/mirrored_strategy_runner.py, not installable with
current pyspark; followed here from its source) is kept: its `sc`, its task count, its GPUs
(`num_slots` split over the tasks, the first ones one more; mapped through the executor's
CUDA_VISIBLE_DEVICES; blanked for CPU training), its errors and their moments, its SSL setting.
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

from hora import engines, environment
from hora.config import RunConfig
from hora.engines.spark import ENGINE as SPARK
from hora.engines.spark import Session, active_session
from hora.job import launch
from hora.spark._distributor import CUDA_VISIBLE_DEVICES, driver_gpus

__all__ = ["MirroredStrategyRunner"]

#: spark-tensorflow-distributor's opt-in to unencrypted training on a TLS cluster
TENSORFLOW_IGNORE_SSL = "tensorflow.spark.distributor.ignoreSsl"


class MirroredStrategyRunner:
    """spark_tensorflow_distributor.MirroredStrategyRunner's contract on hora.

    `num_slots`: GPUs (with `use_gpu`) or CPU tasks to use. `local_mode`: run on the driver in
    one process (CPU: one slot only, as the original). `use_gpu`: give the tasks their Spark GPU
    resources `gpu_resource_name`: `num_slots` GPUs in all, over `ceil(num_slots /
    spark.task.resource.<name>.amount)` tasks, the first tasks one more when they do not divide;
    each rank sees only its own. Without it, ranks see no GPU. `use_custom_strategy`: call
    `train_fn` as it is (it builds its own strategy) instead of inside
    `MultiWorkerMirroredStrategy().scope()`. `sc`: the SparkContext (one is started, as the
    original does, when none is active: in the constructor unless `local_mode`, else when `sc`
    is first read).
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
        if not isinstance(num_slots, int) or num_slots <= 0:
            raise ValueError(
                f"num_slots is set to {num_slots!r} but cannot be less than or equal to 0."
            )
        self.num_slots = int(num_slots)
        self.local_mode = bool(local_mode)
        self.use_gpu = bool(use_gpu)
        self.gpu_resource_name = gpu_resource_name
        self.use_custom_strategy = bool(use_custom_strategy)
        self._session = active_session()
        self._num_tasks: int | None = None
        if not self.local_mode:
            if self._session is None:  # the original starts its SparkSession here
                self._session = _started_session()
            self._num_tasks = self.get_num_tasks()

    @property
    def sc(self) -> Any:
        """The SparkContext the runner runs on (the original's attribute); a Spark Connect
        session has none."""
        if self._session is None:
            self._session = _started_session()
        sc = getattr(self._session, "sc", None)
        if sc is None:
            raise AttributeError(
                "MirroredStrategyRunner.sc: this is a Spark Connect session, which has no "
                "SparkContext (use the SparkSession itself)"
            )
        return sc

    def get_num_tasks(self) -> int:
        """How many Spark tasks: `num_slots` on CPU; on GPU, as many as the slots need."""
        if not self.use_gpu:
            return self.num_slots
        key = f"spark.task.resource.{self.gpu_resource_name}.amount"
        if self._session is None:
            self._session = _started_session()
        amount = self._session.conf(key) or None
        if amount is None:
            raise ValueError(
                "Your cluster might not have Spark GPU-aware scheduling enabled: the conf "
                f"`{key}` was not found in the Spark configuration. Set it (GPUs per task), or "
                "pass use_gpu=False"
            )
        per_task = int(amount)  # the original's reading: "0.5" is a ValueError too
        if per_task < 1:
            raise ValueError(
                f"The Spark conf `{key}` has a value of {per_task} but it should not have a "
                "value less than 1."
            )
        return math.ceil(self.num_slots / per_task)

    def run(self, train_fn: Callable[..., Any], **kwargs: Any) -> Any:
        """Run `train_fn(**kwargs)` on every rank under the strategy; return rank 0's value."""
        if not callable(train_fn):
            raise TypeError(f"train_fn must be callable, got {type(train_fn).__name__}")
        job = (train_fn, kwargs, self.use_custom_strategy)
        if self.local_mode:
            config = RunConfig(
                np=1,
                backend=engines.DEFAULT,
                env={CUDA_VISIBLE_DEVICES: self._local_gpus()},
                collect_all=False,
            )
            return launch(_train, job, {}, config)[0]
        assert self._num_tasks is not None
        tasks = self._num_tasks
        counts = None
        if self.use_gpu:  # the original's split: num_slots // tasks each, the first ones one more
            counts = [self.num_slots // tasks + (p < self.num_slots % tasks) for p in range(tasks)]
        config = RunConfig(
            np=tasks,
            backend=SPARK.name,
            use_gpu=self.use_gpu,
            env={} if self.use_gpu else {CUDA_VISIBLE_DEVICES: ""},
            collect_all=False,
            engine_options={
                "gpu_resource": self.gpu_resource_name,
                "task_gpu_counts": counts,
                "ignore_ssl_key": TENSORFLOW_IGNORE_SSL,
            },
        )
        return launch(_train, job, {}, config)[0]

    def _local_gpus(self) -> str:
        """CUDA_VISIBLE_DEVICES of the one local process: `num_slots` of the driver's GPUs
        (the original samples them at random; hora takes the first), or none on CPU."""
        if not self.use_gpu:
            if self.num_slots > 1:
                raise ValueError(
                    f"Cannot run with more than one CPU machine in local mode (num_slots="
                    f"{self.num_slots}): local_mode=True with use_gpu=False runs one process on "
                    "the driver, so num_slots must be 1 (use local_mode=False for several CPU "
                    "tasks)"
                )
            return ""
        session = self._session
        if (
            session is not None
            and session.kind == "classic"
            and not session.driver_gpus(self.gpu_resource_name)
        ):
            raise ValueError(
                f"The provided GPU resource name `{self.gpu_resource_name}` was not found in "
                f"the driver's resources: set spark.driver.resource.{self.gpu_resource_name}"
                ".amount and its discoveryScript, or pass use_gpu=False"
            )
        gpus = driver_gpus(self.gpu_resource_name)
        if self.num_slots > len(gpus):
            raise ValueError(
                f"{self.num_slots} slots were requested for local training with GPU training "
                f"but only {len(gpus)} GPUs were available."
            )
        return ",".join(gpus[: self.num_slots])


def _started_session() -> Session:
    """The active session, or a new one, as the original's `SparkSession.builder.getOrCreate()`
    (a Spark Connect one where SPARK_REMOTE says so)."""
    try:
        from pyspark.sql import SparkSession  # only here: local mode never needs pyspark
    except ImportError:
        raise RuntimeError(
            "MirroredStrategyRunner needs pyspark for Spark tasks (local_mode=False) or its `sc`:"
            " pip install 'hora[spark]'"
        ) from None
    SparkSession.builder.getOrCreate()
    session = active_session()
    assert session is not None  # getOrCreate just made one
    return session


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
