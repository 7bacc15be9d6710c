"""hora's stage on a classic session: an RDD barrier stage on the program's SparkContext.

Spark's own slot count (through the JVM), job tags to cancel the stage, and the tasks' Python
chosen per stage (`checks.python_for_tasks`, set on the RDD's function as it is built). pyspark
is imported where a stage starts, so that finding no session loads none of it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any, Literal

from hora.engines.spark import checks, entry
from hora.engines.spark.base import Session

_PYTHON_EXEC_LOCK = threading.Lock()  # two runs at once must not restore each other's choice


class ClassicSession(Session):
    """A SparkContext in this process."""

    kind: Literal["classic", "connect"] = "classic"

    def __init__(self, sc: Any):
        self.sc = sc

    def check(self) -> None:
        """Every SparkContext hora runs on (pyspark >= 3.5) has barrier stages and job tags."""

    @property
    def master(self) -> str:
        return str(self.sc.master)

    def conf(self, key: str, default: str = "") -> str:
        return self.sc.getConf().get(key, default) or default

    def driver_gpus(self, resource: str = "gpu") -> list[str] | None:
        resources = self.sc.resources
        return list(resources[resource].addresses) if resource in resources else None

    def slots(self) -> int:
        """Spark's own count (cores and custom resources), the one it checks barrier stages
        against."""
        jsc = self.sc._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))

    def executors(self) -> int:
        return max(0, int(self.sc._jsc.sc().getExecutorMemoryStatus().size()) - 1)

    def default_channel_host(self) -> str:
        return self.conf("spark.driver.host", "127.0.0.1")

    def thread(self, target: Callable[[], None], name: str) -> threading.Thread:
        from pyspark import InheritableThread  # carries the caller's job group, pool, tags

        return InheritableThread(target=target, name=name)

    def run_barrier(
        self, np: int, driver: dict[str, str], spec: Mapping[str, Any], tag: str
    ) -> Any:
        return self._collect(np, True, driver, spec, tag, f"hora: {np} ranks")

    def run_alone(
        self, driver: dict[str, str], spec: Mapping[str, Any], tag: str, description: str
    ) -> Any:
        return self._collect(1, False, driver, spec, tag, description)

    def _collect(
        self,
        tasks: int,
        barrier: bool,
        driver: dict[str, str],
        spec: Mapping[str, Any],
        tag: str,
        description: str,
    ) -> Any:
        from pyspark import cloudpickle as spark_cloudpickle

        sc = self.sc
        sc.addJobTag(tag)
        sc.setInterruptOnCancel(True)
        sc.setJobDescription(description)
        try:
            # By value: the check must load on an executor whose Python lacks hora.
            spark_cloudpickle.register_pickle_by_value(entry)
            task = partial(entry.run_task, driver, dict(spec))
            rdd = sc.parallelize(range(tasks), tasks)
            rdd = (rdd.barrier() if barrier else rdd).mapPartitions(task)
            with _tasks_python(sc, checks.python_for_tasks(self)):
                rdd._jrdd  # noqa: B018 -- pyspark builds the tasks' PythonFunction here, once
            return rdd.collect()
        finally:
            sc.removeJobTag(tag)

    def cancel(self, tag: str) -> None:
        self.sc.cancelJobsWithTag(tag)


@contextlib.contextmanager
def _tasks_python(sc: Any, python: str | None) -> Iterator[None]:
    """Let the stage's function be built for `python` (None: Spark's own choice). pyspark takes
    the executors' interpreter from `sc.pythonExec` when it serializes an RDD's function, and
    only then; the session's other jobs keep theirs."""
    if python is None:
        yield
        return
    with _PYTHON_EXEC_LOCK:
        saved = sc.pythonExec
        sc.pythonExec = python
        try:
            yield
        finally:
            sc.pythonExec = saved
