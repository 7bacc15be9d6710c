"""`TorchDistributor`: pyspark's API as a thin layer over hora's engines.

`local_mode=True` runs `num_processes` workers on the driver (the local engine, as pyspark runs
`torchrun --standalone` there); `local_mode=False` runs them as a barrier stage of
`num_processes` tasks (the Spark engine). Either way the workers see torchrun's environment, so
`init_process_group()` with no arguments works, and a script runs as `torchrun script.py args`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from hora import environment
from hora._script import check_script, run_script
from hora.config import RunConfig
from hora.engines.spark.session import active_spark_context
from hora.job import launch


class TorchDistributor:
    """pyspark.ml.torch.distributor.TorchDistributor's contract on hora.

    `num_processes`: how many ranks. `local_mode`: on the driver (True) or as Spark tasks
    (False). `use_gpu`: give each rank its GPU (on Spark, the task's GPU resources, which need
    `spark.task.resource.gpu.amount`; on the driver, its GPUs). `max_restarts` (hora only,
    keyword): restart every rank up to that many times when one fails or a task is lost, which
    pyspark's TorchDistributor never does. `min_np`/`max_np` (hora only, keywords): an elastic
    run (see hora.Runner), for functions that use `hvd.elastic`.
    """

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
        if isinstance(num_processes, bool) or not isinstance(num_processes, int):
            raise ValueError(f"num_processes has to be a positive integer, got {num_processes!r}")
        if num_processes <= 0:
            raise ValueError(f"num_processes has to be a positive integer, got {num_processes}")
        self.num_processes = num_processes
        self.local_mode = bool(local_mode)
        self.use_gpu = bool(use_gpu)
        # A bad value fails here, before any run.
        RunConfig(np=num_processes, max_restarts=max_restarts, min_np=min_np, max_np=max_np)
        self.max_restarts = max_restarts
        self.min_np, self.max_np = min_np, max_np

    def run(self, train_object: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> Any:
        """Run `train_object(*args, **kwargs)` on every rank and return rank 0's value, or run
        the script at path `train_object` with the string arguments `args` and return None."""
        config = self._engine()
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
        """The run's config (with the Spark engine's GPU pinning); checks the session first."""
        if not self.local_mode:
            _require_spark_session()
        env: dict[str, str] = {}
        if self.local_mode and self.use_gpu:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(_driver_gpus(self.num_processes))
        config = RunConfig(
            np=self.num_processes,
            backend="local" if self.local_mode else "spark",
            env=env,
            max_restarts=self.max_restarts,
            use_gpu=None if self.local_mode else self.use_gpu,
            collect_all=False,
            min_np=self.min_np,
            max_np=self.max_np,
        )
        return config


def _require_spark_session() -> None:
    """Say what to do in this door's words, before the engine would in Runner's."""
    if active_spark_context() is None:
        raise RuntimeError(
            "TorchDistributor(local_mode=False) runs its processes as Spark tasks and needs an "
            "active SparkSession: create one first (SparkSession.builder...getOrCreate()), or "
            "pass local_mode=True to run them on the driver"
        )


def _driver_gpus(num_processes: int) -> list[str]:
    """The driver's GPUs for local mode: Spark's driver GPU resources, else CUDA's own count."""
    gpus = _spark_driver_gpus()
    if gpus is None:
        gpus = environment.local_gpus()
    if not gpus:
        raise RuntimeError(
            "use_gpu=True (the default) but no GPU was found on the driver; pass use_gpu=False "
            "to train on CPUs"
        )
    if num_processes > len(gpus):
        raise ValueError(
            f"num_processes={num_processes} with use_gpu=True needs one GPU per process, but the "
            f"driver has {len(gpus)} ({','.join(gpus)}); lower num_processes or pass use_gpu=False"
        )
    return gpus[:num_processes]


def _spark_driver_gpus() -> list[str] | None:
    sc = active_spark_context()
    if sc is None:
        return None
    resources = sc.resources
    return list(resources["gpu"].addresses) if "gpu" in resources else None
