"""`TorchDistributor`: pyspark's API as a thin layer over hora's engines.

`local_mode=True` runs `num_processes` workers on the driver (the local engine, as pyspark runs
`torchrun --standalone` there); `local_mode=False` runs them as a barrier stage of
`num_processes` tasks (the Spark engine). Either way the workers see torchrun's environment, so
`init_process_group()` with no arguments works, and a script runs as `torchrun script.py args`;
on Spark numbered as pyspark's one torchrun per task numbers it (LOCAL_RANK 0, GROUP_RANK the
task), so Lightning's `Trainer(devices=1, num_nodes=N)` runs as under pyspark.

What pyspark refuses is refused at the same moment, with pyspark's error class and the start of
its message: a missing SparkSession or GPUs the run cannot have in the constructor
(RuntimeError), a bad `num_processes` there too (ValueError), keyword arguments to a script and
an unencrypted run on a TLS cluster in `run`. docs/spark.md has the whole comparison.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from hora import engines, environment
from hora._script import check_script, run_script
from hora.config import RunConfig
from hora.engines.spark import ENGINE as SPARK
from hora.engines.spark import TORCH_IGNORE_SSL, active_session, gpu_amount_key
from hora.environment import gpus
from hora.job import launch

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


class TorchDistributor:
    """pyspark.ml.torch.distributor.TorchDistributor's contract on hora.

    `num_processes`: how many ranks. `local_mode`: on the driver (True) or as Spark tasks
    (False, which needs an active SparkSession). `use_gpu`: give each rank its GPU: on Spark,
    the task's GPU resources (`spark.task.resource.gpu.amount` must be 1); on the driver, its
    Spark GPU resources (this machine's GPUs without a SparkSession), the first `num_processes`
    of them (fewer ranks, with a warning, when there are fewer). `max_restarts` (hora only,
    keyword): restart every rank up to that many times when one fails or a task is lost, which
    pyspark's TorchDistributor never does. `min_np`/`max_np` (hora only, keywords): an elastic
    run (see hora.Runner), for functions that use `hvd.elastic`.
    """

    #: the Spark setting that lets this door train unencrypted on a TLS cluster (pyspark's)
    _IGNORE_SSL_KEY = TORCH_IGNORE_SSL
    _LOCAL_MODE = "local_mode"  # the argument's name, for messages

    def __init__(
        self,
        num_processes: int = 1,
        local_mode: bool = True,
        use_gpu: bool = True,
        *,
        max_restarts: int | None = None,
        min_np: int | None = None,
        max_np: int | None = None,
    ):
        self.num_processes = positive_int("num_processes", num_processes)
        self.local_mode = bool(local_mode)
        self.use_gpu = bool(use_gpu)
        self.ssl_conf = self._IGNORE_SSL_KEY
        # pyspark's logger name (its own tests read this logger's warnings)
        self.logger = logging.getLogger(type(self).__name__)
        if not self.local_mode:
            _require_spark_session(type(self).__name__, self._LOCAL_MODE)
        self.num_tasks = self._tasks()
        self.max_restarts = max_restarts
        self.min_np, self.max_np = min_np, max_np
        self._run_config = self._engine()  # the one check: a bad value fails here, before a run

    def _tasks(self) -> int:
        """How many Spark tasks (pyspark's `_get_num_tasks`): the GPUs this run needs must be
        there, else RuntimeError; on the driver, fewer GPUs than processes lowers
        `num_processes` to their number, with a warning."""
        if not self.use_gpu:
            return self.num_processes
        if self.local_mode:
            found = len(self._driver_gpus())
            if self.num_processes > found:
                self.logger.warning(
                    "'num_processes' cannot be set to a value greater than the number of "
                    f"available GPUs on the driver, which is {found}. 'num_processes' was reset "
                    "to be equal to the number of available GPUs."
                )
                self.num_processes = found
            return self.num_processes
        _check_task_gpus(self.num_processes)
        return self.num_processes

    def _driver_gpus(self) -> list[str]:
        gpus = driver_gpus()
        if not gpus:
            raise RuntimeError(
                "GPUs were unable to be found on the driver: use_gpu=True (the default) with "
                f"{self._LOCAL_MODE}=True needs the driver's GPUs (with a SparkSession, "
                "spark.driver.resource.gpu.amount and its discoveryScript; without one, this "
                "machine's). Pass use_gpu=False to train on CPUs"
            )
        return gpus

    def run(self, train_object: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> Any:
        """Run `train_object(*args, **kwargs)` on every rank and return rank 0's value, or run
        the script at path `train_object` with the string arguments `args` and return None."""
        config = self._run_config
        if isinstance(train_object, str | os.PathLike):
            if kwargs:
                raise ValueError(
                    "a script takes only string arguments (run(path, '--lr=0.1', ...)); "
                    f"keyword arguments {sorted(kwargs)} cannot be passed to it"
                )
            script = check_script(os.fspath(train_object))
            argv = [str(a) for a in args]
            launch(run_script, (script, argv), {}, config)
            return None
        return launch(train_object, args, kwargs, config)[0]

    def _engine(self) -> RunConfig:
        """The run's config: the engine, each rank's GPUs, this door's SSL opt-in setting."""
        env: dict[str, str] = {}
        options: dict[str, Any] = {}
        if self.local_mode:
            if self.use_gpu:  # pyspark picks a random sample of the driver's GPUs; hora the first
                env[CUDA_VISIBLE_DEVICES] = ",".join(self._driver_gpus()[: self.num_processes])
        else:
            options["ignore_ssl_key"] = self._IGNORE_SSL_KEY
            env[environment.PER_TASK_VAR] = "1"  # torchrun's names as pyspark's tasks see them
            if not self.use_gpu:  # as pyspark's tasks: CPU training on a GPU host sees no GPU
                env[CUDA_VISIBLE_DEVICES] = ""
        return RunConfig(
            np=self.num_processes,
            backend=engines.DEFAULT if self.local_mode else SPARK.name,
            env=env,
            max_restarts=self.max_restarts,
            use_gpu=None if self.local_mode else self.use_gpu,
            collect_all=False,
            engine_options=options,
            min_np=self.min_np,
            max_np=self.max_np,
        )


def positive_int(name: str, value: Any) -> int:
    """pyspark's ValueError for a count <= 0; a bool counts as its value, as in pyspark
    (`numGpus=True` is one process)."""
    if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} has to be a positive integer, got {value!r}")
    return int(value)


def _check_task_gpus(num_processes: int) -> None:
    """On Spark with GPUs: every task needs one GPU (`spark.task.resource.gpu.amount` = 1)."""
    key = gpu_amount_key()
    session = active_session()
    value = session.conf(key, "0") if session is not None else "0"
    try:
        amount = float(value)
    except ValueError:
        raise RuntimeError(f"'{key}' must be a number of GPUs, got {value!r}") from None
    if amount < 1:
        raise RuntimeError(
            f"'{key}' was unset, so gpu usage is unavailable: use_gpu=True (the default) with "
            f"local_mode=False needs GPU tasks ('{key}'=1 and the executors' GPU resources). "
            "Pass use_gpu=False to train on CPUs"
        )
    if amount > 1:
        if num_processes % amount:
            raise RuntimeError(
                f"TorchDistributor 'num_processes' value ({num_processes}) must be a multiple "
                f"of '{key}' ({amount:g}) value."
            )
        raise RuntimeError(
            f"'{key}'={amount:g}: pyspark would run {amount:g} processes in each of "
            f"{num_processes // int(amount)} tasks, but hora runs one rank per Spark task, "
            f"with its own GPU. Set '{key}' to 1 ({num_processes} tasks of one GPU each)"
        )


def driver_gpus(resource: str = "gpu") -> list[str]:
    """The driver's GPUs as CUDA numbers them: with a classic SparkSession, its driver GPU
    resources (mapped through CUDA_VISIBLE_DEVICES, as pyspark's doors read them); without one,
    or from a Spark Connect client (which has no Spark driver: its own GPUs, as pyspark's
    there), this machine's. Empty when there are none."""
    session = active_session()
    if session is None or session.kind == "connect":
        return gpus.local_gpus()
    addresses = session.driver_gpus(resource)
    return gpus.cuda_devices(addresses) if addresses else []


def _require_spark_session(door: str, local_mode: str) -> None:
    """Say what to do in this door's words (pyspark's class: RuntimeError), in the constructor."""
    if active_session() is None:
        raise RuntimeError(
            f"{door}({local_mode}=False) runs its processes as Spark tasks and needs an active "
            "SparkSession: create one first (SparkSession.builder...getOrCreate()), or pass "
            f"{local_mode}=True to run them on the driver"
        )
