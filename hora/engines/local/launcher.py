"""The local engine's launcher: `np` worker processes on this machine, the driver's children."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from hora import engines
from hora.engines import (
    AttemptSpec,
    Capabilities,
    Exited,
    LaunchContext,
    Launcher,
    Output,
    RankPlacement,
    WorkerProcess,
)

LOOPBACK = "127.0.0.1"


def capacity(spec: AttemptSpec, held: int) -> int:
    """This machine can always start more processes: an elastic run gets max_np ranks."""
    return spec.most_ranks


class LocalLauncher(Launcher):
    channel_host = LOOPBACK
    capabilities = Capabilities(  # its ranks run HERE, the default
        reforms_in_place=True,  # a dead process takes nothing of the others with it
        grows_in_place=True,  # a new process joins the running ones through the same store
        exact_count=True,  # this machine's processes: a slot freed is free at once
    )

    def __init__(self, spec: AttemptSpec) -> None:
        self.spec = spec
        self._workers: list[WorkerProcess] = []
        self._store: Any = None
        self._port = 0
        self._ctx: LaunchContext | None = None

    def start(self, ctx: LaunchContext) -> None:
        self._store, port = engines.host_store(LOOPBACK)
        self._port, self._ctx = port, ctx
        for place in engines.placements([LOOPBACK] * self.spec.np):
            self._workers.append(_start_worker(ctx, place, port, self.spec.env))

    def add(
        self, joiners: list[tuple[int, int]], running: list[int], env: Mapping[str, str]
    ) -> None:
        if self._ctx is None:
            raise RuntimeError("the local launcher adds ranks only to a started attempt")
        places = engines.placements([LOOPBACK] * (len(running) + len(joiners)))
        for ident, rank in joiners:  # every host is this one: new ranks follow the running
            worker_env = {**self.spec.env, **env}
            self._workers.append(
                _start_worker(self._ctx, places[rank], self._port, worker_env, ident)
            )

    def stop(self) -> None:
        engines.stop_all(self._workers)
        self._workers = []
        self._store = self._ctx = None


def _start_worker(
    ctx: LaunchContext,
    place: RankPlacement,
    port: int,
    env: Mapping[str, str],
    ident: int | None = None,
) -> WorkerProcess:
    """One rank's process; its output and exit reach the driver as that rank's (`ident`, where
    it joins a world grown in place: the id the driver knows it by)."""
    rank = place.rank if ident is None else ident
    return WorkerProcess(
        ctx.boot(rank),
        engines.worker_env(place, LOOPBACK, port, user_env=env),
        on_line=lambda stream, line: ctx.report(Output(rank, stream, line)),
        on_exit=lambda code: ctx.report(Exited(rank, code)),
        cwd=os.getcwd(),
    )
