"""The code of one Spark barrier task: a supervisor for one rank's worker process.

It runs inside Spark's (reused) Python worker: it registers with the driver's launcher over the
authenticated channel, waits for the plan (every task's host and GPUs, the store's address),
then supervises the rank's worker (`hora.engines.supervisor`), serving it this task's
BarrierTaskContext (`task_context`), and stays until the driver says stop, so a half-finished
job is never left running under a task that Spark thinks has ended.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from hora import environment
from hora.engines.spark.task_context import TaskContextServer
from hora.engines.supervisor import supervised_worker
from hora.wire import channel
from hora.wire.protocol import ALLOWED, Boot, Go, Plan, Stop, TaskReady


@dataclass(frozen=True)
class TaskSpec:
    """What every task of one run needs; its fields travel as plain data in the Spark closure,
    so that `hora.engines.spark.entry` can check the executor's Python before anything of hora
    is loaded."""

    address: tuple[str, int]  # the launcher's supervisor channel on the driver
    worker_address: tuple[str, int]  # the job's channel that workers dial
    secret: bytes
    sys_path: tuple[str, ...]  # the driver's import path, appended in the worker
    gpu_resource: str | None = None  # the Spark resource of the rank's GPUs; None: no GPUs
    rank_setup: str = ""  # what the worker runs before the job (Engine.rank_setup)


def supervise(spec: TaskSpec, _partition: Iterable[Any]) -> Iterator[tuple[int, str]]:
    """mapPartitions body: supervise the rank the driver gives this task; yields (task,
    outcome)."""
    from pyspark import BarrierTaskContext  # the task runs inside pyspark's worker

    ctx = BarrierTaskContext.get()
    task = ctx.partitionId()
    host = ctx.getTaskInfos()[task].address.rsplit(":", 1)[0]
    resources = ctx.resources()
    gpus: list[str] = []
    if spec.gpu_resource in resources:  # as CUDA numbers them in this executor
        gpus = environment.cuda_devices(list(resources[spec.gpu_resource].addresses))
    conn = channel.connect(spec.address, spec.secret, ALLOWED)
    try:
        conn.send(
            TaskReady(
                task,
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
            yield task, "stopped before it started"
            return
        if not isinstance(reply, Go):
            yield task, f"refused: {reply.reason}"
            return
        yield task, _supervise_worker(spec, conn, reply.rank, reply.plan, ctx)
    finally:
        conn.close()


def _supervise_worker(
    spec: TaskSpec, conn: channel.Connection, rank: int, plan: Plan, ctx: Any
) -> str:
    boot = Boot(spec.worker_address, spec.secret, rank, spec.sys_path, spec.rank_setup)
    context = TaskContextServer(ctx, spec.secret)  # the rank's BarrierTaskContext.get()
    try:
        with (
            supervised_worker(conn, boot, plan, context.env) as worker,
            contextlib.suppress(OSError, EOFError),
        ):
            while not isinstance(conn.recv(), Stop):  # until the driver says stop or goes away
                pass
    finally:
        context.close()
    return f"exit {worker.poll()}"
