"""A failed Spark stage in hora's words: which task, on which host, and why, without the JVM stack.

Spark reports a task's Python exception inside a Py4J error of a hundred lines of Java frames.
The task that failed and the Python exception's last line are what a user can act on; a task
that found its executor's Python unlike the driver's (`entry`) gets a message of its own
that names both interpreters and what to set, and so do a task that could not reach the driver,
executors whose Python lacks pyarrow (which Spark Connect needs before hora's code runs) and a
Python worker that crashed. A Spark Connect client gets the same text in its exception, without
the executor's host (the launcher knows it from the task's registration).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from hora.engines.spark import entry
from hora.engines.spark.base import DRIVER_HOST_ENV, DRIVER_HOST_KEY
from hora.engines.spark.checks import PYTHON_KEY, runs_on_this_machine

_BARRIER_TASK = re.compile(r"barrier task ResultTask\(\d+, (\d+)\)")
_LOST_TASK = re.compile(r"Lost task (\d+)\.\d+ in stage [\d.]+ \(TID \d+\) \(([^\s()]+) executor")
_PYTHON_ERROR = re.compile(
    r"PythonException: (?:\[PYTHON_EXCEPTION\] An exception was thrown from the Python worker: )?"
    r"(.*?)(?:\n SQLSTATE|\n\tat |\Z)",
    re.S,
)
_REASON = re.compile(r"(?:Most recent failure reason|Job aborted due to stage failure): (.*)")
_NO_PYARROW = "No module named 'pyarrow'"
_CRASHED = "Python worker exited unexpectedly (crashed)"


@dataclass(frozen=True)
class StageFailure:
    """Why the stage failed: `task` (its partition id, the rank it runs) when Spark says."""

    task: int | None
    host: str | None
    summary: str
    detail: str
    before_start: bool = False  # the task refused to start its rank (see `entry`)


def read(
    error: BaseException,
    driver: dict[str, str],
    master: str,
    on_driver_python: bool,
    connect: bool = False,
) -> StageFailure:
    """The `StageFailure` that the error of a failed barrier stage describes (Py4J's on a
    classic session, the Spark Connect client's with `connect`)."""
    text = str(error)
    refused = _refused_by_entry(text, driver, master, on_driver_python, connect)
    if refused is not None:
        return refused
    task: int | None = None
    host: str | None = None
    if found := _LOST_TASK.search(text):
        task, host = int(found[1]), found[2]
    elif found := _BARRIER_TASK.search(text):
        task = int(found[1])
    if _NO_PYARROW in text:
        summary, detail = no_pyarrow(connect)
        return StageFailure(task, host, summary, detail, before_start=True)
    if _CRASHED in text:
        summary = (
            "its Python worker exited unexpectedly (it crashed, or was killed: out of memory, "
            "a signal)"
        )
        return StageFailure(task, host, summary, java_lines(text))
    if found := _PYTHON_ERROR.search(text):
        trace = found[1].strip()
        lines = [line for line in trace.splitlines() if line.strip()]
        return StageFailure(task, host, lines[-1].strip() if lines else "a Python error", trace)
    reason = _REASON.search(text)
    summary = reason[1].strip() if reason else "the Spark stage failed"
    return StageFailure(task, host, summary, java_lines(text))


def _refused_by_entry(
    text: str, driver: dict[str, str], master: str, on_driver_python: bool, connect: bool
) -> StageFailure | None:
    """A task that `entry` refused to start (its Python, or no way to the driver), or None."""
    if (found := _find_report(text, entry.MARKER)) is not None:
        task, host, report = found
        summary, detail = python_mismatch(
            driver, dict(report["runtime"]), master, on_driver_python, connect
        )
    elif (found := _find_report(text, entry.UNREACHABLE)) is not None:
        task, host, report = found
        summary, detail = driver_unreachable(host, report, connect)
    else:
        return None
    return StageFailure(task, host, summary, detail, before_start=True)


def java_lines(text: str) -> str:
    """The useful part of a Py4J error: the Spark exception lines, not the JVM stack."""
    lines = [line for line in text.splitlines() if line and not line.startswith("\tat ")]
    return "\n".join(lines[:40])


def _find_report(text: str, marker: str) -> tuple[int, str, dict] | None:
    """(task, host, report) of the JSON report after `marker` in a task's error, if any."""
    at = text.find(marker)
    if at < 0:
        return None
    line = text[at + len(marker) :].split("\n", 1)[0]
    try:
        report = json.loads(line)
        return int(report["task"]), str(report["host"]), dict(report)
    except (ValueError, KeyError, TypeError):
        return None


def driver_unreachable(host: str, report: dict, connect: bool) -> tuple[str, str]:
    """(summary, detail) for a task that could not open a connection to hora's driver."""
    where, port = report.get("address", ["?", "?"])
    summary = f"it cannot reach hora's driver at {where}:{port} ({report.get('error')})"
    if connect:
        advice = (
            "On Spark Connect, hora's driver is this client: the executors must be able to open "
            "connections to it (hora's tasks report to it, and the ranks meet there). Run the "
            "client where the executors can reach it (on the cluster's network, e.g. a notebook "
            "on the cluster), or, if this machine has an address they can reach, set "
            f"{DRIVER_HOST_ENV} (or the Spark setting {DRIVER_HOST_KEY}) to it. A client behind "
            "NAT, such as a laptop outside the cluster's network, cannot run hora's Spark engine."
        )
    else:
        advice = (
            f"hora's driver listens on spark.driver.host. If the executors reach this machine "
            f"at another address, set {DRIVER_HOST_ENV} (or the Spark setting {DRIVER_HOST_KEY}) "
            "to it; else open the port range of the driver to the executors."
        )
    return summary, f"The task ran on host {host}.\n\n{advice}"


def no_pyarrow(connect: bool) -> tuple[str, str]:
    """(summary, detail) for executors whose Python cannot import pyarrow."""
    summary = "the executors' Python has no pyarrow, so Spark could not start hora's task"
    if connect:
        detail = (
            "On Spark Connect, hora's stage is a mapInArrow, which needs pyarrow in the Python "
            "that the server starts for its tasks: PYSPARK_PYTHON in the Connect server's "
            "environment (else PYSPARK_DRIVER_PYTHON, else `python3` on the executors' PATH). "
            "Install pyarrow, torch and hora (the client's versions) into that Python on every "
            "executor, or start the server with PYSPARK_PYTHON set to one that has them; with "
            "SparkSession.builder.remote('local[N]'), set PYSPARK_PYTHON before the session is "
            "created."
        )
    else:
        detail = "Install pyarrow in the Python that the executors run (PYSPARK_PYTHON)."
    return summary, detail


def python_mismatch(
    driver: dict[str, str],
    executor: dict[str, str],
    master: str,
    on_driver_python: bool,
    connect: bool = False,
) -> tuple[str, str]:
    """(summary, detail) for an executor whose Python cannot run what the driver pickled."""
    differ = entry.differences(driver, executor)
    verb = "differs" if len(differ) == 1 else "differ"
    summary = (
        f"its Python is not the driver's ({_join(differ)} {verb}), so it cannot run the job "
        "the driver pickled"
    )
    rows = [("interpreter", driver["executable"], executor["executable"])]
    rows += [(key, driver[key], executor[key]) for key in entry.COMPARED]
    width = max(len(value) for _key, value, _ in rows)
    table = [f"  {'':<12} {'driver':<{width}}   executor"]
    table += [
        f"  {key:<12} {mine:<{width}}   {theirs}{'   <- differs' if key in differ else ''}"
        for key, mine, theirs in rows
    ]
    if connect:
        advice = (
            "On Spark Connect the server chooses the executors' Python: PYSPARK_PYTHON in the "
            "Connect server's environment when it started (else PYSPARK_DRIVER_PYTHON, else "
            "`python3` on the executors' PATH); the client cannot. Install the client's versions "
            "of these into that Python on every executor, or restart the server with "
            "PYSPARK_PYTHON set to an interpreter that has them (with "
            "SparkSession.builder.remote('local[N]'), set PYSPARK_PYTHON before the session is "
            "created)."
        )
    elif on_driver_python:
        advice = (
            f"The tasks ran the driver's interpreter ({PYTHON_KEY}=driver), yet it imports other "
            "versions on the executors: make the driver's environment the same on every "
            "executor, or set PYSPARK_PYTHON to an interpreter that has the driver's versions "
            f"and remove {PYTHON_KEY}."
        )
    else:
        advice = (
            "Spark started the tasks with the executors' Python: PYSPARK_PYTHON as the driver's "
            "environment had it when the SparkSession started (spark-submit: "
            "spark.pyspark.python), else the `python3` on the executors' PATH. Set PYSPARK_PYTHON, "
            "before the SparkSession starts, to an interpreter that has the driver's versions "
            "on every executor"
        )
        if runs_on_this_machine(master):
            advice += (
                f". On this master ({master}) hora starts the tasks with the driver's "
                f"interpreter by itself: remove {PYTHON_KEY}=spark."
            )
        else:
            advice += (
                f", or, if the driver's interpreter exists with the same packages on every "
                f"executor, set {PYTHON_KEY}=driver."
            )
    return summary, "\n".join(table) + "\n\n" + advice


def _join(items: list[str]) -> str:
    if not items:
        return "nothing"
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
