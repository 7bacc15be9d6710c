"""The local engine's launcher: `np` worker processes on this machine, the driver's children."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from hora import environment
from hora.engines.base import LaunchContext, Launcher
from hora.engines.process import WorkerProcess, stop_all
from hora.engines.rendezvous import host_store
from hora.wire.protocol import Exited, Output

if TYPE_CHECKING:
    from hora.config import RunConfig

LOOPBACK = "127.0.0.1"
STOP_GRACE_SECONDS = 3.0


def capacity(config: RunConfig, held: int) -> int:
    """This machine can always start more processes: an elastic run gets max_np ranks."""
    return config.most_ranks


class LocalLauncher(Launcher):
    channel_host = LOOPBACK

    def __init__(self, config: RunConfig | None = None, restart: bool = False) -> None:
        self._workers: list[WorkerProcess] = []
        self._store: Any = None

    def start(self, ctx: LaunchContext) -> None:
        self._store, port = host_store(LOOPBACK)
        for place in environment.placements([LOOPBACK] * ctx.np):
            env = environment.worker_env(place, LOOPBACK, port, user_env=ctx.env)
            rank = place.rank
            self._workers.append(
                WorkerProcess(
                    ctx.boot(rank),
                    env,
                    on_line=lambda stream, line, r=rank: ctx.report(Output(r, stream, line)),
                    on_exit=lambda code, r=rank: ctx.report(Exited(r, code)),
                    cwd=os.getcwd(),
                )
            )

    def stop(self) -> None:
        stop_all(self._workers, STOP_GRACE_SECONDS)
        self._workers = []
        self._store = None
