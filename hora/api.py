"""The doors: HorovodRunner's `Runner(np).run(main, **kwargs)` and horovod's `run(fn, ...)`."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hora import engines
from hora.config import Reporter, RunConfig, Verbosity
from hora.job import launch_with_metrics


class Runner:
    """Run a training function on `np` processes: HorovodRunner's contract.

    `np < 0` runs `-np` worker processes on this machine; `np > 0` runs `np` ranks on the
    cluster the program has started: a Spark barrier stage of `np` tasks on the active
    SparkSession, else `np` Ray actors after `ray.init()` (`backend=` names the engine, and
    `engine_options` are its options, see hora.engines). `driver_log_verbosity="all"` streams
    every rank's output to the driver; `"log_callback_only"` only what the workers send with
    `log_to_driver`.
    `max_restarts=N` restarts every rank up to N times when one fails (load your last checkpoint
    at the start of `main`: see `hora.checkpoint`). `min_np`/`max_np` make the run elastic
    (Horovod's): after a failure it goes on with as many ranks as the cluster can run, at least
    `min_np`, and grows back to `max_np` at a commit of `hvd.elastic`; every attempt after the
    first spends one of `max_restarts` (default 10 when elastic).
    `output_filename` is a folder where each rank's output also goes (horovodrun's option).
    Metrics the ranks send with `hora.report` are printed per step and handed to `report_to`
    (hora.reporters.TensorBoard, MLflow, any callable); `return_metrics=True` makes `run`
    return `(value, metrics)`, the metrics one dict per step.
    `ship_code`: whether hora and the user's own modules go to a cluster's ranks with the job
    (None: `HORA_SHIP_CODE`, by default where the ranks may lack them; docs/shipping.md).
    """

    def __init__(
        self,
        np: int,
        *,
        driver_log_verbosity: Verbosity = "all",
        start_timeout: float = 600,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        max_restarts: int | None = None,
        output_filename: str | os.PathLike[str] | None = None,
        backend: str | None = None,
        engine_options: Mapping[str, Any] | None = None,
        report_to: Sequence[Reporter] | Reporter = (),
        progress: bool = True,
        return_metrics: bool = False,
        min_np: int | None = None,
        max_np: int | None = None,
        ship_code: bool | None = None,
    ):
        if isinstance(np, bool) or not isinstance(np, int):
            raise ValueError(f"np must be an int, got {np!r}")
        if np == 0:
            raise ValueError(
                "np=0 (all of the cluster's slots) is not supported: pass np=-N to run N "
                "processes on this machine, or np=N for N Spark tasks (or Ray actors)"
            )
        self.np = np
        self.config = RunConfig(
            np=abs(np),
            backend=backend or (engines.DEFAULT if np < 0 else engines.for_cluster()),
            driver_log_verbosity=driver_log_verbosity,
            start_timeout=start_timeout,
            timeout=timeout,
            env=dict(env or {}),
            max_restarts=max_restarts,
            output_filename=_folder(output_filename),
            engine_options=dict(engine_options or {}),
            collect_all=False,
            report_to=report_to,
            progress=progress,
            min_np=min_np,
            max_np=max_np,
            ship_code=ship_code,
        )
        self.return_metrics = bool(return_metrics)

    def run(self, main: Callable[..., Any], **kwargs: Any) -> Any:
        """Run `main(**kwargs)` on every rank; return rank 0's return value (and the metrics,
        with `return_metrics=True`)."""
        results, metrics = launch_with_metrics(main, (), kwargs, self.config)
        return (results[0], metrics) if self.return_metrics else results[0]


HorovodRunner = Runner


def run(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    np: int,
    backend: str = "auto",
    env: Mapping[str, str] | None = None,
    start_timeout: float = 600,
    timeout: float | None = None,
    driver_log_verbosity: Verbosity = "all",
    max_restarts: int | None = None,
    output_filename: str | os.PathLike[str] | None = None,
    engine_options: Mapping[str, Any] | None = None,
    report_to: Sequence[Reporter] | Reporter = (),
    progress: bool = True,
    return_metrics: bool = False,
    min_np: int | None = None,
    max_np: int | None = None,
    ship_code: bool | None = None,
) -> Any:
    """Run `fn(*args, **kwargs)` on `np` processes; return every rank's value in rank order.

    `backend="auto"` uses Spark when a SparkSession is active, else Ray after `ray.init()`,
    else local processes; `engine_options` are the engine's own (hora.engines).
    `max_restarts=N` restarts every rank up to N times when one fails; `min_np`/`max_np` make
    the run elastic (see Runner); the values are then those of the last attempt's ranks.
    `output_filename`: as horovod.run's, a folder that gets `rank.<rank>/stdout` and `stderr`.
    `report_to`, `progress`: where the ranks' `hora.report` metrics go (see Runner);
    `return_metrics=True` returns `(values, metrics)`. `ship_code`: as Runner's.
    """
    config = RunConfig(
        np=np,
        backend=engines.resolve(backend),
        driver_log_verbosity=driver_log_verbosity,
        start_timeout=start_timeout,
        timeout=timeout,
        env=dict(env or {}),
        max_restarts=max_restarts,
        output_filename=_folder(output_filename),
        engine_options=dict(engine_options or {}),
        report_to=report_to,
        progress=progress,
        min_np=min_np,
        max_np=max_np,
        ship_code=ship_code,
    )
    results, metrics = launch_with_metrics(fn, tuple(args), dict(kwargs or {}), config)
    return (results, metrics) if return_metrics else results


def _folder(path: str | os.PathLike[str] | None) -> str | None:
    """A path as RunConfig keeps it; anything else goes through for RunConfig to refuse."""
    return os.fspath(path) if isinstance(path, os.PathLike) else path
