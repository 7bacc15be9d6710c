"""The engines that can run a job, in one registry: adding one means adding one folder here.

Each engine package (`hora.engines.local`, `.spark`, `.ray`) declares an `Engine` in its
`__init__`: its name, how it knows it is active (for `backend="auto"`), the options it takes,
and where its launcher lives. The declaration imports nothing heavy: the launcher's module (and
with it pyspark or ray) is imported only when a launcher is built, so `RunConfig(np=2)` or
asking whether Spark is active never loads an engine. `RunConfig`, the doors and the CLI ask this
registry, so none of them lists engines itself.

Beside the registry: `base` (what every launcher implements), `process` (one worker process),
`rendezvous` (the torch store the launcher hosts), `supervisor` (a rank's supervisor on a
cluster engine, shared by Spark tasks and Ray actors).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hora.config import RunConfig
    from hora.engines.base import Launcher

#: Where the engines are declared. The order is `auto`'s: the first active engine wins, so a
#: cluster the program has started (a SparkSession, then `ray.init()`) is preferred to this
#: machine.
ENGINE_PACKAGES = ("hora.engines.spark", "hora.engines.ray", "hora.engines.local")


@dataclass(frozen=True)
class Engine:
    """One engine as the doors see it."""

    name: str
    #: whether the program has this engine's cluster at hand (`auto`); never imports a framework
    is_active: Callable[[], bool]
    #: "module:Class" of its `Launcher`, imported only when a launcher is built; the class takes
    #: `(config, restart)` and checks the engine (cluster, slots, Python) before anything starts
    launcher: str
    #: the options it takes (`engine_options=`), name -> what it means
    options: Mapping[str, str] = field(default_factory=dict)
    #: turns the user's `engine_options` into the engine's own (defaults filled in), or raises
    #: ValueError saying what to change
    check_options: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    #: whether every rank runs on this machine (a script then need not exist elsewhere)
    on_this_host: bool = False
    #: for `hora run --backend NAME`: "module:function" of a context manager that starts and
    #: stops the engine's cluster connection (a SparkSession, `ray.init()`), raising ValueError
    #: when it cannot; None when the engine needs none
    cli_session: str | None = None
    #: one line for `hora run --help`
    summary: str = ""
    #: "module:function" of `(config, held) -> int`: how many ranks of this job the cluster could
    #: run now, `held` being the ranks this job's running attempt holds (0 between attempts);
    #: None when the engine cannot tell, and then it runs no elastic job (min_np/max_np)
    capacity: str | None = None

    def make_launcher(self, config: RunConfig, restart: bool = False) -> Launcher:
        """The launcher of one attempt. `restart`: a later attempt, which waits (up to
        `start_timeout`) for lost capacity to return."""
        launcher_class = _load(self.launcher)
        return launcher_class(config, restart)

    def free_ranks(self, config: RunConfig, held: int = 0) -> int:
        """`capacity`'s answer: how many ranks the cluster could run now (elastic runs)."""
        if self.capacity is None:
            raise ValueError(f"the {self.name!r} engine cannot count its free slots")
        return int(_load(self.capacity)(config, held))

    def session(self, **options: Any) -> AbstractContextManager[None] | None:
        """A fresh `cli_session` context (with `options`, e.g. Spark's `remote`), or None."""
        return _load(self.cli_session)(**options) if self.cli_session else None


def _load(where: str) -> Any:
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)


def _declared(package: str) -> Engine:
    engine = importlib.import_module(package).ENGINE
    if not isinstance(engine, Engine):
        raise TypeError(f"{package}.ENGINE is not a hora.engines.Engine")
    return engine


def engines() -> Iterator[Engine]:
    """Every engine, in `auto`'s order."""
    for package in ENGINE_PACKAGES:
        yield _declared(package)


def names() -> tuple[str, ...]:
    return tuple(engine.name for engine in engines())


def get(name: str) -> Engine:
    """The engine called `name`; a ValueError lists the others."""
    for engine in engines():
        if engine.name == name:
            return engine
    raise ValueError(f"backend must be one of {names()}, got {name!r}")


def active(*, cluster_only: bool = False) -> Engine | None:
    """The first engine whose cluster is at hand; with `cluster_only`, never this machine's."""
    for engine in engines():
        if cluster_only and engine.on_this_host:
            continue
        if engine.is_active():
            return engine
    return None


def resolve(backend: str) -> str:
    """`auto` becomes the first active engine's name; any other name must be an engine's."""
    if backend == "auto":
        found = active()
        return found.name if found else "local"
    if not isinstance(backend, str):
        raise ValueError(f"backend must be 'auto' or one of {names()}, got {backend!r}")
    return get(backend).name


def check_options(backend: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` checked by `backend`'s engine: unknown names are refused with the known ones."""
    engine = get(backend)
    unknown = sorted(set(options) - set(engine.options))
    if unknown:
        known = ", ".join(sorted(engine.options)) or "none"
        raise ValueError(
            f"engine_options {unknown} are not options of the {backend!r} engine (it takes: "
            f"{known})"
        )
    return engine.check_options(options) if engine.check_options else dict(options)
