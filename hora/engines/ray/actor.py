"""The code of one Ray actor: a supervisor for one rank's worker process, as a Spark task is.

It runs inside a Ray worker process: it reports where it is (host, Ray's GPUs, its CPUs), then
supervises the rank's worker (`hora.engines.supervised_worker`) until the worker exits or the driver
asks it to stop. Nothing here imports ray at import time: the engine wraps this class with
`ray.remote`.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from hora import engines
from hora.engines import ALLOWED, Boot, Plan


class RankSupervisor:
    """One slot's actor: `where()`, then `run(...)` for the rank the driver gives it (ranks are
    numbered host by host once every actor has said where it is), until the worker exits or
    `stop()`."""

    def __init__(self, cpus: float):
        self.cpus = cpus
        self._stop = threading.Event()

    def where(self) -> dict[str, Any]:
        """This rank's host, the GPUs Ray assigned to this actor, its CPUs and process."""
        import ray  # the actor runs inside a Ray worker

        return {
            "host": ray.util.get_node_ip_address(),
            "gpus": [str(g) for g in ray.get_gpu_ids()],
            "cpus": max(1, int(self.cpus)),
            "node": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
        }

    def run(self, plan: Plan, boot: Boot, place: int | None = None) -> int | None:
        """Start the rank's worker and relay it to the driver; returns its exit code. `place`:
        the rank's index in `plan` where it is not `boot.rank` (a rank joining a world grown in
        place). Called again when the last worker died under a live actor."""
        conn = engines.connect(boot.address, boot.secret, ALLOWED)
        try:
            with engines.supervised_worker(conn, boot, plan, place=place) as worker:
                while not (worker.exited.is_set() or self._stop.wait(0.05)):
                    pass
        finally:
            conn.close()
        return worker.poll()

    def stop(self) -> None:
        """Stop the worker (SIGTERM, then SIGKILL): `run` returns once it is gone."""
        self._stop.set()
