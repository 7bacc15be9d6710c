"""The link between a rank and its Spark task's BarrierTaskContext, without Spark: a real server
(the supervisor's side) around a stand-in context, a real rank process that imports pyspark, and
a supervisor process killed while the rank waits in `allGather`. The same link on real Spark is
in test_doors_local.py and test_doors_cluster.py."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
from types import SimpleNamespace

import pytest

from hora.engines.spark import task_context
from hora.wire import channel

pytestmark = pytest.mark.spark  # beside Spark's JVM when run after the other Spark modules

SECRET = channel.new_secret()


class StandInContext:
    """What the supervisor's BarrierTaskContext answers; `allGather` may block until told."""

    def __init__(self, entered: threading.Event | None = None, release: object = None):
        self.entered = entered
        self.release = release

    def stageId(self) -> int:
        return 7

    def partitionId(self) -> int:
        return 1

    def attemptNumber(self) -> int:
        return 0

    def taskAttemptId(self) -> int:
        return 42

    def cpus(self) -> int:
        return 2

    def resources(self) -> dict:
        return {"gpu": SimpleNamespace(addresses=["0", "1"])}

    def getTaskInfos(self) -> list:
        return [SimpleNamespace(address="10.0.0.1:7077"), SimpleNamespace(address="10.0.0.2:7077")]

    def getLocalProperty(self, key: str) -> str | None:
        return {"job": "set on the driver"}.get(key)

    def allGather(self, message: str) -> list[str]:
        if self.entered is not None:
            self.entered.set()
            self.release.wait()
        return ["from partition 0", message]

    def barrier(self) -> None:
        pass


RANK = textwrap.dedent("""\
    import json, sys
    from hora.engines.spark import task_context
    task_context.install(bytes.fromhex(sys.stdin.readline()))
    assert "pyspark" not in sys.modules  # installed without importing it
    from pyspark import BarrierTaskContext, TaskContext
    ctx = BarrierTaskContext.get()
    print(json.dumps({
        "same": TaskContext.get() is ctx,
        "partition": ctx.partitionId(), "stage": ctx.stageId(), "attempt": ctx.attemptNumber(),
        "task_attempt_id": ctx.taskAttemptId(), "cpus": ctx.cpus(),
        "cpu_amount": str(ctx.cpuAmount()),
        "gpus": ctx.resources()["gpu"].addresses,
        "infos": [i.address for i in ctx.getTaskInfos()],
        "gathered": ctx.allGather("from partition 1"),
        "property": ctx.getLocalProperty("job"), "missing": ctx.getLocalProperty("nope"),
        "barrier": ctx.barrier(),
    }))
    """)


def test_a_rank_that_imports_pyspark_gets_its_task_s_context():
    server = task_context.TaskContextServer(StandInContext(), SECRET)
    try:
        done = subprocess.run(
            [sys.executable, "-c", RANK],
            input=SECRET.hex() + "\n",
            env={**os.environ, **server.env},
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.close()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "same": True,
        "partition": 1,
        "stage": 7,
        "attempt": 0,
        "task_attempt_id": 42,
        "cpus": 2,
        "cpu_amount": "2",
        "gpus": ["0", "1"],
        "infos": ["10.0.0.1:7077", "10.0.0.2:7077"],
        "gathered": ["from partition 0", "from partition 1"],
        "property": "set on the driver",
        "missing": None,
        "barrier": None,
    }


def test_nothing_is_installed_outside_a_spark_rank(monkeypatch):
    monkeypatch.delenv(task_context.ADDRESS_ENV, raising=False)
    hooks = list(sys.meta_path)
    task_context.install(SECRET)
    assert sys.meta_path == hooks


def _serve_until_killed(address_out, entered) -> None:
    server = task_context.TaskContextServer(StandInContext(entered, threading.Event()), SECRET)
    address_out.send(server.env[task_context.ADDRESS_ENV])
    threading.Event().wait()


def test_a_rank_waiting_in_all_gather_hears_at_once_that_its_task_is_gone():
    """The supervisor's process dies (its task was killed, its executor lost) while the rank
    waits in allGather: the call raises, saying so, instead of waiting forever."""
    fork = multiprocessing.get_context("fork")
    address_in, address_out = fork.Pipe(duplex=False)
    entered = fork.Event()
    supervisor = fork.Process(target=_serve_until_killed, args=(address_out, entered))
    supervisor.start()
    try:
        host, _, port = address_in.recv().rpartition(":")
        link = task_context.TaskLink((host, int(port)), task_context._key(SECRET))
        failure: list[BaseException] = []

        def gather() -> None:
            try:
                link.call("allGather", "waiting")
            except BaseException as exc:
                failure.append(exc)

        waiting = threading.Thread(target=gather)
        waiting.start()
        assert entered.wait(30)  # the task is inside Spark's allGather for this rank
        os.kill(supervisor.pid, signal.SIGKILL)
        waiting.join(10)
        assert not waiting.is_alive()
    finally:
        supervisor.kill()
        supervisor.join()
    assert isinstance(failure[0], RuntimeError)
    assert "this rank's Spark task is gone" in str(failure[0])
    with pytest.raises(RuntimeError, match="Spark task is gone"):  # and so does the next call
        link.call("barrier")
