"""The local engine: `np` worker processes on this machine, the driver's children."""

from __future__ import annotations

import os
import sys
from typing import Any

from hora import environment
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
        sys_path = _driver_sys_path()
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


def _driver_sys_path() -> list[str]:
    """The driver's import path, so modules it can import (a notebook's sys.path.append too)
    unpickle in the workers; '' (the current folder) made absolute."""
    return [os.path.abspath(p) if p == "" else p for p in sys.path]
