"""The local engine: `np` worker processes on this machine, the driver's children."""

from __future__ import annotations

import os
from typing import Any

from hora import environment
from hora.engines import Engine
from hora.job.protocol import Exited, Output
from hora.launchers._base import LaunchContext, Launcher
from hora.launchers._process import WorkerProcess, stop_all
from hora.launchers._rendezvous import host_store

LOOPBACK = "127.0.0.1"
STOP_GRACE_SECONDS = 3.0


class LocalLauncher(Launcher):
    channel_host = LOOPBACK

    def __init__(self) -> None:
        self._workers: list[WorkerProcess] = []
        self._store: Any = None

    def start(self, ctx: LaunchContext) -> None:
        self._store, port = host_store(LOOPBACK)
        sys_path = environment.driver_sys_path()
        for place in environment.placements([LOOPBACK] * ctx.np):
            env = environment.worker_env(place, LOOPBACK, port, user_env=ctx.env)
            rank = place.rank
            self._workers.append(
                WorkerProcess(
                    ctx.boot(rank) | {"sys_path": sys_path},
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


ENGINE = Engine(
    name="local",
    is_active=lambda: True,
    make_launcher=lambda config, use_gpu, restart: LocalLauncher(),
    on_this_host=True,
    summary="processes on this machine (the default)",
)
