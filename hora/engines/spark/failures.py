"""A failed Spark stage in hora's words: which task, on which host, and why, without the JVM stack.

Spark reports a task's Python exception inside a Py4J error of a hundred lines of Java frames.
The task that failed and the Python exception's last line are what a user can act on; a task
that found its executor's Python unlike the driver's (`entry`) gets a message of its own
that names both interpreters and what to set.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from hora.engines.spark import entry
from hora.engines.spark.checks import PYTHON_KEY, runs_on_this_machine

_BARRIER_TASK = re.compile(r"barrier task ResultTask\(\d+, (\d+)\)")
_LOST_TASK = re.compile(r"Lost task (\d+)\.\d+ in stage [\d.]+ \(TID \d+\) \(([^\s()]+) executor")
_PYTHON_ERROR = re.compile(
    r"PythonException: (?:\[PYTHON_EXCEPTION\] An exception was thrown from the Python worker: )?"
    r"(.*?)(?:\n SQLSTATE|\n\tat |\Z)",
    re.S,
)
_REASON = re.compile(r"(?:Most recent failure reason|Job aborted due to stage failure): (.*)")


@dataclass(frozen=True)
class StageFailure:
    """Why the stage failed: `task` (its partition id, the rank it runs) when Spark says."""

    task: int | None
    host: str | None
    summary: str
    detail: str
    before_start: bool = False  # the task refused to start its rank (see `entry`)


def read(
    error: BaseException, driver: dict[str, str], master: str, on_driver_python: bool
) -> StageFailure:
    """The `StageFailure` that the Py4J `error` of a failed barrier stage describes."""
    text = str(error)
    mismatch = _find_mismatch(text)
    if mismatch is not None:
        summary, detail = python_mismatch(driver, mismatch[2], master, on_driver_python)
        return StageFailure(mismatch[0], mismatch[1], summary, detail, before_start=True)
    task: int | None = None
    host: str | None = None
    if found := _LOST_TASK.search(text):
        task, host = int(found[1]), found[2]
    elif found := _BARRIER_TASK.search(text):
        task = int(found[1])
    if found := _PYTHON_ERROR.search(text):
        trace = found[1].strip()
        lines = [line for line in trace.splitlines() if line.strip()]
        return StageFailure(task, host, lines[-1].strip() if lines else "a Python error", trace)
    reason = _REASON.search(text)
    summary = reason[1].strip() if reason else "the Spark stage failed"
    return StageFailure(task, host, summary, java_lines(text))


def java_lines(text: str) -> str:
    """The useful part of a Py4J error: the Spark exception lines, not the JVM stack."""
    lines = [line for line in text.splitlines() if line and not line.startswith("\tat ")]
    return "\n".join(lines[:40])


def _find_mismatch(text: str) -> tuple[int, str, dict[str, str]] | None:
    at = text.find(entry.MARKER)
    if at < 0:
        return None
    line = text[at + len(entry.MARKER) :].split("\n", 1)[0]
    try:
        report = json.loads(line)
        return int(report["task"]), str(report["host"]), dict(report["runtime"])
    except (ValueError, KeyError, TypeError):
        return None


def python_mismatch(
    driver: dict[str, str], executor: dict[str, str], master: str, on_driver_python: bool
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
    if on_driver_python:
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
