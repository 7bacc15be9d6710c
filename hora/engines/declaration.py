"""An engine as the doors see it: its name, when it is active, and where its code lives.

A declaration imports nothing heavy: its launcher, capacity count, session and rank setup are
"module:name" strings, imported only when used, so asking whether an engine is active, or
checking its options, never loads pyspark or ray.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from hora.engines.base import AttemptSpec, Launcher
from hora.engines.capabilities import RanksRun


@dataclass(frozen=True)
class Engine:
    """One engine as the doors see it: an engine package's `ENGINE`, a third party's
    `register(Engine(...))`, or what an entry point of the `hora.engines` group loads to."""

    name: str
    #: whether the program has this engine's cluster at hand (`auto`); never imports a framework
    is_active: Callable[[], bool]
    #: "module:Class" of its `Launcher`, imported only when a launcher is built; the class takes
    #: `(spec: AttemptSpec)` and checks the engine (cluster, slots, Python) before anything
    #: starts
    launcher: str
    #: the options it takes (`engine_options=`), name -> what it means
    options: Mapping[str, str] = field(default_factory=dict)
    #: turns the user's `engine_options` into the engine's own (defaults filled in), or raises
    #: ValueError saying what to change
    check_options: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    #: where its ranks run, as far as the declaration can tell before any launcher is built:
    #: `RanksRun.HERE` (this machine's processes: `auto` tries it last, a script need exist only
    #: here, the hosts' commits are this machine's) or elsewhere; its launcher's `capabilities`
    #: say it for each attempt
    ranks_run: RanksRun = RanksRun.ON_CLUSTER
    #: for `hora run --backend NAME`: "module:function" of a context manager that starts and
    #: stops the engine's cluster connection (a SparkSession, `ray.init()`), raising ValueError
    #: when it cannot; None when the engine needs none
    cli_session: str | None = None
    #: the keyword options `cli_session` takes (Spark's "remote": `hora run --remote URL`)
    session_options: tuple[str, ...] = ()
    #: one line for `hora run --help`
    summary: str = ""
    #: "module:function" of `(spec, held) -> int`: how many ranks of this job (`spec`: its
    #: options and GPUs) the cluster could run now, `held` being the ranks this job's running
    #: attempt holds (0 between attempts); None when the engine cannot tell, and then it runs
    #: no elastic job (min_np/max_np)
    capacity: str | None = None
    #: "module:function" every rank calls with its `hora.wire.protocol.Boot` before the job
    #: runs, in the rank's process (Spark's: pyspark's TaskContext becomes the rank's task);
    #: None when the engine's ranks need nothing
    rank_setup: str | None = None

    def make_launcher(self, spec: AttemptSpec) -> Launcher:
        """The launcher of one attempt; a restart's (`spec.restart`) waits, up to
        `spec.start_timeout`, for lost capacity to return."""
        launcher_class = load(self.launcher)
        return launcher_class(spec)

    def free_ranks(self, spec: AttemptSpec, held: int = 0) -> int:
        """`capacity`'s answer: how many ranks the cluster could run now (elastic runs)."""
        if self.capacity is None:
            raise ValueError(f"the {self.name!r} engine cannot count its free slots")
        return int(load(self.capacity)(spec, held))

    def session(self, **options: Any) -> AbstractContextManager[None] | None:
        """A fresh `cli_session` context (with `options`, e.g. Spark's `remote`), or None."""
        return load(self.cli_session)(**options) if self.cli_session else None


def load(where: str) -> Any:
    """What `where` ("module:name") names, its module imported now."""
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)
