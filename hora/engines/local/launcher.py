"""The local engine's launcher: `np` worker processes on this machine, the driver's children."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from hora import environment
from hora.engines.base import LaunchContext, Launcher
from hora.engines.process import WorkerProcess, remove_segments_left, stop_all
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
        self._port = 0

    def start(self, ctx: LaunchContext) -> None:
        self._store, port = host_store(LOOPBACK)
        self._port = port
        for place in environment.placements([LOOPBACK] * ctx.np):
            self._workers.append(_start_worker(ctx, place, port))

    def stop(self) -> None:
        stop_all(self._workers, STOP_GRACE_SECONDS)
        if self._workers:
            remove_segments_left((LOOPBACK, self._port))
        self._workers = []
        self._store = None


def _start_worker(ctx: LaunchContext, place: environment.RankPlacement, port: int) -> WorkerProcess:
    """One rank's process; its output and exit reach the driver as that rank's."""
    rank = place.rank
    return WorkerProcess(
        ctx.boot(rank),
        environment.worker_env(place, LOOPBACK, port, user_env=ctx.env),
        on_line=lambda stream, line: ctx.report(Output(rank, stream, line)),
        on_exit=lambda code: ctx.report(Exited(rank, code)),
        cwd=os.getcwd(),
    )
