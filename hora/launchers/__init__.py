"""Engines that start workers. Adding one means adding a module here and a branch below."""

from __future__ import annotations

from hora.config import RunConfig
from hora.launchers._base import LaunchContext, Launcher


def make_launcher(config: RunConfig, *, use_gpu: bool | None = None) -> Launcher:
    """The launcher for `config.backend`.

    `use_gpu` is the Spark engine's GPU pinning: None pins when tasks have GPU resources.
    """
    if config.backend == "local":
        from hora.launchers.local import LocalLauncher

        return LocalLauncher()
    from hora.launchers.spark import SparkLauncher

    return SparkLauncher(config, use_gpu=use_gpu)


__all__ = ["LaunchContext", "Launcher", "make_launcher"]
