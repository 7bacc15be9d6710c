"""Engines that start workers. Adding one means adding a module here and a branch below."""

from __future__ import annotations

from hora.config import RunConfig
from hora.launchers._base import LaunchContext, Launcher


def make_launcher(
    config: RunConfig, use_gpu: bool | None = None, *, restart: bool = False
) -> Launcher:
    """A launcher for `config.backend`, for one attempt of a run.

    `use_gpu` is the Spark engine's GPU pinning: None pins when tasks have GPU resources.
    `restart`: a later attempt, which waits (up to `start_timeout`) for lost capacity to return.
    """
    if config.backend == "local":
        from hora.launchers.local import LocalLauncher

        return LocalLauncher()
    from hora.launchers.spark import SparkLauncher

    return SparkLauncher(config, use_gpu=use_gpu, restart=restart)


__all__ = ["LaunchContext", "Launcher", "make_launcher"]
