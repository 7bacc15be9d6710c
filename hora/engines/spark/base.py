"""What hora's Spark engine needs of a Spark session, whichever its kind (`Session`).

Two kinds implement it: `classic.ClassicSession` (a SparkContext in this process) and
`connect.ConnectSession` (a Spark Connect client: Databricks Connect, shared and serverless
clusters, `SparkSession.builder.remote(...)`), which has no SparkContext; `session` finds the
active one.
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, Literal

#: Where the tasks dial hora's driver, when Spark's own idea of it is not reachable from them.
DRIVER_HOST_ENV = "HORA_DRIVER_HOST"
DRIVER_HOST_KEY = "spark.hora.driverHost"


class Session(ABC):
    """The active Spark session as hora uses it: read its configuration, count its slots, run
    one barrier stage of hora's tasks (or each task as a job of its own), cancel them."""

    kind: Literal["classic", "connect"]

    @property
    @abstractmethod
    def master(self) -> str:
        """The cluster's master URL (`local[2]`, `local-cluster[2,1,1024]`, `yarn`, ...)."""

    @abstractmethod
    def conf(self, key: str, default: str = "") -> str:
        """A Spark setting as the cluster has it, or `default` when it is not set."""

    @abstractmethod
    def check(self) -> None:
        """Raise if this session cannot run hora's stage at all, saying what to change."""

    @abstractmethod
    def driver_gpus(self, resource: str = "gpu") -> list[str] | None:
        """The addresses of the Spark driver's GPU resources, or None when it has none."""

    @abstractmethod
    def slots(self) -> int | None:
        """How many tasks can run at once now (cores only), or None when it cannot be known."""

    @abstractmethod
    def executors(self) -> int | None:
        """How many executors are registered, or None when it cannot be known."""

    @abstractmethod
    def default_channel_host(self) -> str:
        """The address of this machine that the executors reach, as far as Spark says."""

    @abstractmethod
    def thread(self, target: Callable[[], None], name: str) -> threading.Thread:
        """A (not started) thread that carries the caller's Spark job group, pool and tags."""

    @abstractmethod
    def run_barrier(
        self, np: int, driver: dict[str, str], spec: Mapping[str, Any], tag: str
    ) -> Any:
        """Run `np` tasks of `entry` in one barrier stage tagged `tag`; blocks until it ends and
        returns its rows, one (task, outcome) per task."""

    def run_alone(
        self, driver: dict[str, str], spec: Mapping[str, Any], tag: str, description: str
    ) -> Any:
        """Run one task of `entry` as a Spark job of its own, tagged `tag`: its loss ends no
        other task (an elastic run's ranks, `launcher`). Blocks until it ends; its rows."""
        raise NotImplementedError(f"a {self.kind} session runs hora's tasks in one barrier stage")

    @abstractmethod
    def cancel(self, tag: str) -> None:
        """Cancel the stage tagged `tag` (and only it); callable from any thread."""

    def channel_host(self) -> str:
        """Where the tasks dial hora's driver: HORA_DRIVER_HOST (or spark.hora.driverHost),
        else what this kind of session knows."""
        override = os.environ.get(DRIVER_HOST_ENV) or self.conf(DRIVER_HOST_KEY)
        return override.strip() if override.strip() else self.default_channel_host()
