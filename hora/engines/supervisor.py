"""A rank's supervisor on a cluster engine: what a Spark task and a Ray actor both do for it.

The supervisor runs inside the cluster's own worker process (Spark's reused Python worker, a Ray
actor), so it never runs the job itself: it starts `python -m hora.rank.worker` in a fresh process
with the rank's environment (CUDA_VISIBLE_DEVICES included, before torch is imported), forwards
the worker's output lines and exit code to the driver's channel, and stops the worker (SIGTERM,
then SIGKILL) when it leaves, whatever made it leave.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from hora import _shipping
from hora.engines.process import WorkerProcess, stop_all
from hora.environment.build import supervised_rank_env
from hora.wire.channel import Connection
from hora.wire.protocol import Boot, Exited, Output, Plan


class SupervisedWorker:
    """The rank's worker process, and an event set once its exit has been reported."""

    def __init__(self, worker: WorkerProcess, exited: threading.Event):
        self.worker = worker
        self.exited = exited

    def poll(self) -> int | None:
        return self.worker.poll()


@contextmanager
def supervised_worker(
    conn: Connection,
    boot: Boot,
    plan: Plan,
    engine_env: Mapping[str, str] | None = None,
    place: int | None = None,
) -> Iterator[SupervisedWorker]:
    """Start `boot.rank`'s worker as `plan` says and relay it on `conn`; stop it on exit.
    `engine_env`: what the engine adds for the rank (set last). `place`: the rank's index in
    `plan.ranks` where it is not `boot.rank` (a rank started to grow a world in place has an id
    of its own, after every id used before)."""
    rank = boot.rank
    exited = threading.Event()

    def on_line(stream: str, line: str) -> None:
        with contextlib.suppress(OSError):
            conn.send(Output(rank, stream, line))

    def on_exit(code: int) -> None:
        with contextlib.suppress(OSError):
            conn.send(Exited(rank, code))
        exited.set()

    env = supervised_rank_env(
        rank if place is None else place,
        plan.ranks,
        plan.master,
        plan.use_gpu,
        os.environ,
        plan.own_gpus,
    )
    env.update(plan.user_env)
    env.update(engine_env or {})
    _shipping.rank_pythonpath(env)  # a shipped hora is where this supervisor found it
    cwd = plan.cwd if os.path.isdir(plan.cwd) else None  # the driver's, where it exists
    worker = WorkerProcess(boot, env, on_line=on_line, on_exit=on_exit, cwd=cwd)
    try:
        yield SupervisedWorker(worker, exited)
    finally:
        stop_all([worker])
        exited.wait(timeout=2)
