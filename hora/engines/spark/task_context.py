"""pyspark's `BarrierTaskContext.get()` and `TaskContext.get()` inside a rank on Spark.

A rank runs in a process that its Spark task's supervisor started, not in the task, so pyspark's
TaskContext there is empty and `BarrierTaskContext.get()` raises NOT_IN_BARRIER_STAGE. Code
written for spark-tensorflow-distributor (whose training function runs in the task) calls it
all the same. So the supervisor serves its task's context on 127.0.0.1 (`TaskContextServer`,
authenticated with a key derived from the run's secret) and puts the address in the rank's
environment; in the rank, `install` makes pyspark's TaskContext a proxy of that task as soon as
the rank's code imports pyspark (hora never imports it there). The proxy answers with the task's
own values (partitionId is the task's partition, which need not be the rank: ranks are numbered
host by host), and its `allGather` and `barrier` are the task's, among the stage's tasks.

When the task is gone (it ended, was killed, or its executor or the driver was lost) a call
raises a RuntimeError that says so, at once: the link is a socket to the supervisor's process.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import queue
import sys
import threading
from collections.abc import Callable, Mapping
from decimal import Decimal
from types import ModuleType
from typing import Any, NamedTuple

from hora import engines
from hora.engines import Boot, Connection

#: the rank's environment variable that holds its task's context server, "host:port"
ADDRESS_ENV = "HORA_SPARK_TASK_CONTEXT"
_KEY_PURPOSE = b"hora.spark task context"
_PYSPARK_MODULE = "pyspark.taskcontext"
_CONNECT_TIMEOUT = 30.0
NOT_A_BARRIER_STAGE = (
    "BarrierTaskContext.{method}() is not there in an elastic Spark run: each rank runs in a "
    "Spark job of its own, not in one barrier stage, so that a lost rank leaves the others "
    "running; meet the other ranks through hvd's or torch.distributed's collectives instead"
)


class TaskCall(NamedTuple):
    """A rank asks its Spark task: "snapshot" (the task's fixed values), "allGather",
    "barrier" or "getLocalProperty", with its one argument."""

    method: str
    argument: str | None = None


class TaskReply(NamedTuple):
    """The task's answer (plain data), or why the call failed there."""

    value: Any
    error: str | None = None


#: the only classes a rank and its Spark task's context server exchange
TASK_CONTEXT_ALLOWED = engines.allowed_classes(TaskCall, TaskReply)


def _key(secret: bytes) -> bytes:
    return engines.derived_key(secret, _KEY_PURPOSE)


# ----- in the Spark task (the supervisor) -------------------------------------------------------
class TaskContextServer:
    """Serves one task's BarrierTaskContext to its rank, each call in its own thread (an
    `allGather` blocks until every task of the stage has called it)."""

    def __init__(self, context: Any, secret: bytes):
        self._context = context
        self._inbox: queue.Queue = queue.Queue()
        self._server = engines.Server(_key(secret), self._inbox, TASK_CONTEXT_ALLOWED)
        host, port = self._server.address
        #: what the rank's environment gets
        self.env = {ADDRESS_ENV: f"{host}:{port}"}
        self._dispatcher = threading.Thread(
            target=self._dispatch, name="hora-task-context", daemon=True
        )
        self._dispatcher.start()

    def _dispatch(self) -> None:
        while True:
            conn, call = self._inbox.get()
            if conn is None:
                return
            if isinstance(call, TaskCall):
                threading.Thread(target=self._answer, args=(conn, call), daemon=True).start()

    def _answer(self, conn: Connection, call: TaskCall) -> None:
        try:
            reply = TaskReply(self._call(call.method, call.argument))
        except Exception as exc:
            reply = TaskReply(None, f"{type(exc).__name__}: {exc}")
        with contextlib.suppress(OSError):
            conn.send(reply)

    def _call(self, method: str, argument: str | None) -> Any:
        ctx = self._context
        if method == "snapshot":
            return snapshot(ctx)
        if method in ("allGather", "barrier") and not hasattr(ctx, method):
            raise RuntimeError(NOT_A_BARRIER_STAGE.format(method=method))
        if method == "allGather":
            return [str(m) for m in ctx.allGather(argument or "")]
        if method == "barrier":
            ctx.barrier()
            return None
        if method == "getLocalProperty":
            return ctx.getLocalProperty(argument)
        raise ValueError(f"unknown task context call {method!r}")

    def close(self) -> None:
        """Stop serving: the rank's next call (or the one it waits in) raises."""
        self._server.close()
        self._inbox.put((None, None))
        self._dispatcher.join(timeout=5)


def snapshot(ctx: Any) -> dict[str, Any]:
    """A task's fixed values as plain data (what crosses to the rank)."""
    cpu_amount = getattr(ctx, "cpuAmount", None)  # pyspark >= 4.3
    return {
        "stageId": ctx.stageId(),
        "partitionId": ctx.partitionId(),
        "attemptNumber": ctx.attemptNumber(),
        "taskAttemptId": ctx.taskAttemptId(),
        "cpus": ctx.cpus(),
        "cpuAmount": None if cpu_amount is None else str(cpu_amount()),
        "resources": {name: list(info.addresses) for name, info in ctx.resources().items()},
        "taskInfos": [info.address for info in getattr(ctx, "getTaskInfos", list)()],
    }


# ----- in the rank ------------------------------------------------------------------------------
class TaskLink:
    """The rank's end: one authenticated connection to its task's server, made on first use
    (again in a forked child), calls one at a time."""

    def __init__(self, address: tuple[str, int], key: bytes):
        self._address = address
        self._key = key
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._pid = 0
        self._snapshot: dict[str, Any] | None = None

    def call(self, method: str, argument: str | None = None) -> Any:
        with self._lock:
            try:
                if self._conn is None or self._pid != os.getpid():
                    self._conn = engines.connect(
                        self._address, self._key, TASK_CONTEXT_ALLOWED, timeout=_CONNECT_TIMEOUT
                    )
                    self._pid = os.getpid()
                self._conn.send(TaskCall(method, argument))
                reply = self._conn.recv()
            except (OSError, EOFError) as exc:
                self._conn = None
                raise RuntimeError(
                    f"BarrierTaskContext.{method}(): this rank's Spark task is gone (the task that "
                    f"started the rank closed its link, {type(exc).__name__}: {exc}); the task "
                    "ended or was killed, or its executor or the driver was lost"
                ) from None
        if reply.error is not None:
            raise RuntimeError(
                f"BarrierTaskContext.{method}() failed in this rank's Spark task: {reply.error}"
            )
        return reply.value

    def value(self, name: str) -> Any:
        if self._snapshot is None:
            self._snapshot = self.call("snapshot")
        return self._snapshot[name]


class _RankTaskContext:
    """The Spark task that started this rank, seen from the rank: every method asks the task
    (mixed into the rank's own pyspark BarrierTaskContext by `proxy_class`)."""

    _taskcontext: ModuleType  # the rank's pyspark.taskcontext, set by proxy_class

    def __new__(cls, link: TaskLink) -> _RankTaskContext:
        return object.__new__(cls)  # pyspark's __new__ hands out its singleton

    def __init__(self, link: TaskLink):
        self._link = link

    def stageId(self) -> int:
        return int(self._link.value("stageId"))

    def partitionId(self) -> int:
        return int(self._link.value("partitionId"))

    def attemptNumber(self) -> int:
        return int(self._link.value("attemptNumber"))

    def taskAttemptId(self) -> int:
        return int(self._link.value("taskAttemptId"))

    def cpus(self) -> int:
        return int(self._link.value("cpus"))

    def cpuAmount(self) -> Decimal:
        amount = self._link.value("cpuAmount")
        return Decimal(amount if amount is not None else self.cpus())

    def resources(self) -> dict[str, Any]:
        info = self._taskcontext.ResourceInformation
        return {name: info(name, a) for name, a in self._link.value("resources").items()}

    def getTaskInfos(self) -> list[Any]:
        return [self._taskcontext.BarrierTaskInfo(a) for a in self._link.value("taskInfos")]

    def getLocalProperty(self, key: str) -> str | None:
        return self._link.call("getLocalProperty", key)

    def allGather(self, message: str = "") -> list[str]:
        if not isinstance(message, str):
            raise TypeError("Argument `message` must be of type `str`")
        return list(self._link.call("allGather", message))

    def barrier(self) -> None:
        self._link.call("barrier")


def proxy_class(taskcontext: ModuleType) -> type:
    """A BarrierTaskContext (so `TaskContext.get()` and `BarrierTaskContext.get()` both return
    it) whose every method asks the rank's task, built on the rank's own pyspark."""
    bases = (_RankTaskContext, taskcontext.BarrierTaskContext)
    return type("RankTaskContext", bases, {"_taskcontext": taskcontext})


def rank_setup(boot: Boot) -> None:
    """The Spark engine's `rank_setup`: what a rank runs before its job (`install`)."""
    install(boot.secret)


def install(secret: bytes, environ: Mapping[str, str] | None = None) -> None:
    """In a rank whose environment names its task's server: make pyspark's TaskContext that
    task's proxy, now if pyspark is imported, else the moment it is. Elsewhere, nothing."""
    where = (os.environ if environ is None else environ).get(ADDRESS_ENV)
    if not where:
        return
    host, _, port = where.rpartition(":")
    link = TaskLink((host, int(port)), _key(secret))

    def set_context(taskcontext: ModuleType) -> None:
        taskcontext.TaskContext._taskContext = proxy_class(taskcontext)(link)

    module = sys.modules.get(_PYSPARK_MODULE)
    if module is not None:
        set_context(module)
    else:
        sys.meta_path.insert(0, _AfterImport(_PYSPARK_MODULE, set_context))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then(module)` once `name` has been imported, without importing it (the import
    machinery's own hook: the module's loader is wrapped the one time it is found)."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]):
        self._name = name
        self._then = then

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self._name:
            return None
        sys.meta_path.remove(self)  # once; the other finders find the module itself
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenLoader(spec.loader, self._then)
        return spec


class _ThenLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, then: Callable[[ModuleType], None]):
        self._loader = loader
        self._then = then

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._then(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ...: the real loader's
        return getattr(self._loader, name)
