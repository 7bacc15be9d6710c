"""The code of one Spark task of hora's: a supervisor for one rank's worker process.

It runs inside Spark's (reused) Python worker: it registers with the driver's launcher over the
authenticated channel, waits for the plan (every task's host and GPUs, the store's address),
then supervises the rank's worker (`hora.engines.supervised_worker`), serving it this task's
BarrierTaskContext (`task_context`), and stays until the driver says stop, so a half-finished
job is never left running under a task that Spark thinks has ended.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from hora import engines
from hora.engines import ALLOWED, Boot, Connection, Go, Stop, TaskReady
from hora.engines.spark.task_context import TaskContextServer


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
    #: the task's slot where each rank is a Spark job of its own (`launcher`: a lost one must not
    #: end the others); None: the task is one of a barrier stage, its slot its partition
    slot: int | None = None


def supervise(spec: TaskSpec, _partition: Iterable[Any]) -> Iterator[tuple[int, str]]:
    """mapPartitions body: supervise the rank the driver gives this task; yields (task,
    outcome)."""
    ctx = _task_context(spec)
    task = ctx.partitionId() if spec.slot is None else spec.slot
    resources = ctx.resources()
    gpus: list[str] = []
    if spec.gpu_resource in resources:  # as CUDA numbers them in this executor
        gpus = engines.cuda_devices(list(resources[spec.gpu_resource].addresses))
    conn = engines.connect(spec.address, spec.secret, ALLOWED)
    try:
        if spec.slot is None:
            host = ctx.getTaskInfos()[task].address.rsplit(":", 1)[0]
        else:  # a task outside a barrier stage is not told its executor's address
            host = conn.local_host
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
        yield task, _supervise_worker(spec, conn, reply, ctx)
    finally:
        conn.close()


def _task_context(spec: TaskSpec) -> Any:
    """This task's pyspark context: a barrier stage's, or a plain task's (`spec.slot`)."""
    from pyspark import BarrierTaskContext, TaskContext  # the task runs inside pyspark's worker

    return BarrierTaskContext.get() if spec.slot is None else TaskContext.get()


def _supervise_worker(spec: TaskSpec, conn: Connection, go: Go, ctx: Any) -> str:
    """Run the worker of `go.rank` (known to the driver as `go.ident`, where it joins a world
    grown in place) until the driver says stop."""
    ident = go.rank if go.ident is None else go.ident
    boot = Boot(spec.worker_address, spec.secret, ident, spec.sys_path, spec.rank_setup)
    context = TaskContextServer(ctx, spec.secret)  # the rank's BarrierTaskContext.get()
    try:
        with (
            engines.supervised_worker(conn, boot, go.plan, context.env, go.rank) as worker,
            contextlib.suppress(OSError, EOFError),
        ):
            while not isinstance(conn.recv(), Stop):  # until the driver says stop or goes away
                pass
    finally:
        context.close()
    return f"exit {worker.poll()}"
