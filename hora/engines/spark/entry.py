"""The first code a Spark barrier task runs: it checks that this executor's Python can run the job.

The driver pickles the job with its own interpreter and libraries. A rank started by another
Python (Spark starts the `python3` on the executors' PATH unless PYSPARK_PYTHON says otherwise)
fails in ways that name neither interpreter: `No module named 'hora'` inside Spark's own
unpickling, or `Can't get attribute '_function_setstate'` from an older cloudpickle. So this
module uses the standard library only and is shipped to the executors by value, not by import:
it loads where hora does not, compares this interpreter with the driver's, and only then imports
hora's supervisor. A difference fails the task with a line (`MARKER` + JSON) that the driver
finds in Spark's error and turns into one message; so does a task that cannot reach the driver
(`UNREACHABLE`: a Spark Connect client the executors cannot dial).

On a classic session the stage is an RDD's `mapPartitions` (`run_task`); on Spark Connect it is
a barrier `mapInArrow` (`run_task_arrow`), whose rows go back as Arrow record batches.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

MARKER = "hora-task-cannot-start:"
UNREACHABLE = "hora-task-cannot-reach-driver:"
#: seconds a task tries to reach the driver before it says it cannot
DIAL_TIMEOUT = 30.0
# What decides whether a rank can run the driver's pickles, in the order a message lists them.
COMPARED = ("python", "cloudpickle", "torch", "hora")


def runtime() -> dict[str, str]:
    """This interpreter, and the versions of what the driver's pickles need, as text."""
    import platform
    import sys

    return {
        "executable": sys.executable,
        "python": f"{platform.python_version()} ({platform.python_implementation()})",
        "cloudpickle": _imported_version("cloudpickle"),
        "torch": _installed_version("torch"),  # importing torch would cost seconds per task
        "hora": _imported_version("hora"),
    }


def differences(driver: dict[str, str], here: dict[str, str]) -> list[str]:
    """The keys of COMPARED that differ; Python by major.minor and implementation (the
    bytecode and pickles of one minor version agree across its patch releases)."""
    return [key for key in COMPARED if _compared(key, driver) != _compared(key, here)]


def _compared(key: str, runtime: dict[str, str]) -> str | None:
    value = runtime.get(key)
    if key == "python" and value:
        version, _, implementation = value.partition(" ")
        return ".".join(version.split(".")[:2]) + " " + implementation
    return value


def run_task(driver: dict[str, str], spec: dict[str, Any], partition: Iterable[Any]) -> Iterator:
    """mapPartitions body: refuse to start a rank on a Python unlike the driver's, else supervise
    it (`spec` holds `TaskSpec`'s fields as plain data, so unpickling it needs no hora)."""
    here = runtime()
    differ = differences(driver, here)
    if differ:
        why = (
            f"this executor's Python ({here['executable']}) is not the driver's "
            f"({', '.join(differ)} differ; the driver's error has the details)"
        )
        raise _refusal(why, MARKER, {"runtime": here}, spec.get("slot"))
    address = tuple(spec["address"])
    error = _cannot_dial(address)
    if error is not None:
        why = f"this executor cannot reach hora's driver at {address[0]}:{address[1]} ({error})"
        raise _refusal(
            why, UNREACHABLE, {"address": list(address), "error": error}, spec.get("slot")
        )
    from hora.engines.spark.task import TaskSpec, supervise

    yield from supervise(TaskSpec(**spec), partition)


def run_task_arrow(
    driver: dict[str, str], spec: dict[str, Any], batches: Iterable[Any]
) -> Iterator:
    """mapInArrow body (Spark Connect): `run_task`, its (task, outcome) rows as Arrow batches
    of the stage's schema ("task long, outcome string")."""
    import pyarrow

    for _ in batches:  # the range's one row: nothing to read
        pass
    for task, outcome in run_task(driver, spec, ()):
        yield pyarrow.RecordBatch.from_pydict({"task": [task], "outcome": [outcome]})


def _refusal(why: str, marker: str, report: dict[str, Any], slot: int | None) -> RuntimeError:
    """The error that fails this task: `why`, then `marker` and the JSON report (with this
    task's slot and host) on a line of its own, for the driver to find. `slot`: the task's, where
    it is a job of its own (None: its partition in a barrier stage)."""
    import json
    import socket

    if slot is None:
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        task = ctx.partitionId()
        host = ctx.getTaskInfos()[task].address.rsplit(":", 1)[0]
    else:
        task, host = slot, socket.gethostname()
    report = {"task": task, "host": host, **report}
    return RuntimeError(f"hora did not start rank {task}: {why}\n{marker}{json.dumps(report)}")


def _cannot_dial(address: tuple[str, int]) -> str | None:
    """Why this executor cannot open a connection to the driver's channel, or None if it can."""
    import socket

    try:
        socket.create_connection(address, timeout=DIAL_TIMEOUT).close()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _imported_version(module: str) -> str:
    """The version this interpreter imports (what unpickling will use), or why it cannot."""
    import importlib

    try:
        return str(importlib.import_module(module).__version__)
    except Exception as exc:
        return f"not importable ({type(exc).__name__}: {exc})"


def _installed_version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"
