"""The code of one Ray actor: a supervisor for one rank's worker process, as a Spark task is.

It runs inside a Ray worker process, so it never runs the job itself: it reports where it is
(host, Ray's GPUs, its CPUs), then starts `python -m hora._worker` in a fresh process with the
rank's environment (CUDA_VISIBLE_DEVICES included, before torch is imported), forwards the
worker's output lines and exit code to the driver's job channel, and stops the worker when the
driver asks. Nothing here imports ray: the engine wraps this class with `ray.remote`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

from hora import _channel, environment
from hora.job.protocol import Exited, Output
from hora.launchers._process import WorkerProcess, stop_all

STOP_GRACE_SECONDS = 3.0


class RankSupervisor:
    """One rank's actor: `where()`, then `run(...)` until the worker exits or `stop()`."""

    def __init__(self, rank: int, cpus: float):
        self.rank = rank
        self.cpus = cpus
        self._stop = threading.Event()

    def where(self) -> dict[str, Any]:
        """This rank's host, the GPUs Ray assigned to this actor, its CPUs and process."""
        import ray

        return {
            "host": ray.util.get_node_ip_address(),
            "gpus": [str(g) for g in ray.get_gpu_ids()],
            "cpus": max(1, int(self.cpus)),
            "node": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
        }

    def run(self, plan: dict[str, Any], boot: dict[str, Any], secret: bytes) -> int | None:
        """Start the rank's worker and relay it to the driver; returns its exit code."""
        rank = self.rank
        conn = _channel.connect(tuple(plan["channel"]), secret)
        exited = threading.Event()

        def on_line(stream: str, line: str) -> None:
            with contextlib.suppress(OSError):
                conn.send(Output(rank, stream, line))

        def on_exit(code: int) -> None:
            with contextlib.suppress(OSError):
                conn.send(Exited(rank, code))
            exited.set()

        env = environment.supervised_rank_env(
            rank, plan["ranks"], tuple(plan["master"]), plan["use_gpu"], os.environ
        )
        env.update(plan["user_env"])
        cwd = plan["cwd"] if os.path.isdir(plan["cwd"]) else None  # the driver's, where it exists
        worker = WorkerProcess(boot, env, on_line=on_line, on_exit=on_exit, cwd=cwd)
        try:
            while not (exited.is_set() or self._stop.wait(0.05)):
                pass
        finally:
            stop_all([worker], STOP_GRACE_SECONDS)
            exited.wait(timeout=2)
            conn.close()
        return worker.poll()

    def stop(self) -> None:
        """Stop the worker (SIGTERM, then SIGKILL): `run` returns once it is gone."""
        self._stop.set()
