"""How workers are started. Each engine declares itself in its own module (hora.engines)."""

from __future__ import annotations

from hora import engines
from hora.config import RunConfig
from hora.launchers._base import LaunchContext, Launcher


def make_launcher(
    config: RunConfig, use_gpu: bool | None = None, *, restart: bool = False
) -> Launcher:
    """A launcher of `config.backend`'s engine, for one attempt of a run.

    `use_gpu` is a cluster engine's GPU pinning: None pins when ranks are given GPUs.
    `restart`: a later attempt, which waits (up to `start_timeout`) for lost capacity to return.
    """
    return engines.get(config.backend).make_launcher(config, use_gpu, restart)


__all__ = ["LaunchContext", "Launcher", "make_launcher"]
