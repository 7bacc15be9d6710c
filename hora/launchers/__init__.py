"""Engines that start workers. Adding one means adding a module here and a branch below."""

from __future__ import annotations

from hora.config import RunConfig
from hora.launchers._base import LaunchContext, Launcher


def make_launcher(config: RunConfig) -> Launcher:
    """The launcher for `config.backend`."""
    if config.backend == "local":
        from hora.launchers.local import LocalLauncher

        return LocalLauncher()
    raise NotImplementedError(
        "the Spark engine (np > 0, backend='spark') is not available yet; run on this machine "
        "with Runner(np=-N) or hora.run(..., backend='local')"
    )


__all__ = ["LaunchContext", "Launcher", "make_launcher"]
