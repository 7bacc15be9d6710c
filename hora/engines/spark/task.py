"""The code of one Spark barrier task: a supervisor for one rank's worker process.

It runs inside Spark's (reused) Python worker, so it never imports a framework or runs the job
itself: it registers with the driver's launcher over the authenticated channel, waits for the
plan (every task's host and GPUs, the store's address), then starts `python -m hora._worker` in a
fresh process with the rank's environment (CUDA_VISIBLE_DEVICES included), forwards its output
lines and its exit code, and stays until the driver says stop, so a half-finished job is never
left running under a task that Spark thinks has ended.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from hora import _channel, environment
from hora.job.protocol import Exited, Go, Output, Stop, TaskReady
from hora.launchers._process import WorkerProcess, stop_all

STOP_GRACE_SECONDS = 3.0


@dataclass(frozen=True)
class TaskSpec:
    """What every task of one run needs; its fields travel as plain data in the Spark closure,
    so that `_spark_entry` can check the executor's Python before anything of hora is loaded."""

    address: tuple[str, int]  # the launcher's supervisor channel on the driver
    worker_address: tuple[str, int]  # the job's channel that workers dial
    secret: bytes
    sys_path: tuple[str, ...]  # the driver's import path, appended in the worker


def supervise(spec: TaskSpec, _partition: Iterable[Any]) -> Iterator[tuple[int, str]]:
    """mapPartitions body: supervise this task's rank; yields (rank, outcome)."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    rank = ctx.partitionId()
    host = ctx.getTaskInfos()[rank].address.rsplit(":", 1)[0]
    resources = ctx.resources()
    gpus = list(resources["gpu"].addresses) if "gpu" in resources else []
    conn = _channel.connect(spec.address, spec.secret)
    try:
        conn.send(
            TaskReady(
                rank,
                {
                    "host": host,
                    "gpus": gpus,
                    "cpus": ctx.cpus(),
                    "attempt": ctx.attemptNumber(),
                    "task_attempt_id": ctx.taskAttemptId(),
                    "stage": ctx.stageId(),
                    "pid": os.getpid(),
                },
            )
        )
        try:
            reply = conn.recv()
        except (OSError, EOFError):  # the driver stopped the run before every task had started
            yield rank, "stopped before it started"
            return
        if not isinstance(reply, Go):
            yield rank, f"refused: {reply.reason}"
            return
        yield rank, _supervise_worker(spec, conn, rank, reply.plan)
    finally:
        conn.close()


def _supervise_worker(
    spec: TaskSpec, conn: _channel.Connection, rank: int, plan: dict[str, Any]
) -> str:
    def on_line(stream: str, line: str) -> None:
        with contextlib.suppress(OSError):
            conn.send(Output(rank, stream, line))

    exited = threading.Event()

    def on_exit(code: int) -> None:
        with contextlib.suppress(OSError):
            conn.send(Exited(rank, code))
        exited.set()

    env = environment.supervised_rank_env(
        rank, plan["tasks"], plan["master"], plan["use_gpu"], os.environ
    )
    env.update(plan["user_env"])
    boot = {
        "address": list(spec.worker_address),
        "secret": spec.secret.hex(),
        "rank": rank,
        "sys_path": list(spec.sys_path),
    }
    worker = WorkerProcess(boot, env, on_line=on_line, on_exit=on_exit, cwd=os.getcwd())
    try:
        while True:  # until the driver says stop or goes away
            message = conn.recv()
            if isinstance(message, Stop):
                break
    except (OSError, EOFError):
        pass
    finally:
        stop_all([worker], STOP_GRACE_SECONDS)
        exited.wait(timeout=2)
    code = worker.poll()
    return f"exit {code}"
