"""The engines that can run a job, in one open registry: an engine is one folder here, or a
third party's `register(Engine(...))`; nothing above this package names one.

Each engine package (`hora.engines.local`, `.spark`, `.ray`) declares an `Engine` in its
`__init__` (its public face, the only module of it the doors import): its name, how it knows it
is active (for `backend="auto"`), the options it takes, where its launcher lives and what a rank
runs first. The declaration imports nothing heavy: the launcher's module (and with it pyspark or
ray) is imported only when a launcher is built, so `RunConfig(np=2)` or asking whether Spark is
active never loads an engine. `RunConfig`, the doors and the CLI ask this registry.

Words: the public keyword is `backend=` (Horovod's and pyspark's); inside hora, an `Engine` is
what runs ranks, and `backend` is only ever its name.

Beside the registry: `base` (what every launcher implements, and the `AttemptSpec` it gets),
`process` (one worker process), `rendezvous` (the torch store the launcher hosts), `supervisor`
(a rank's supervisor on a cluster engine, shared by Spark tasks and Ray actors).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from hora.engines.base import AttemptSpec as AttemptSpec
from hora.engines.base import LaunchContext as LaunchContext
from hora.engines.base import Launcher as Launcher

#: Where hora's own engines are declared. The order is `auto`'s: the first active engine wins,
#: so a cluster the program has started (a SparkSession, then `ray.init()`) is preferred to this
#: machine.
ENGINE_PACKAGES = ("hora.engines.spark", "hora.engines.ray", "hora.engines.local")
#: the engine of this machine, the doors' default (`np < 0`, `local_mode=True`, `hora run`)
DEFAULT = "local"


@dataclass(frozen=True)
class Engine:
    """One engine as the doors see it."""

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
    #: whether every rank runs on this machine (a script then need not exist elsewhere)
    on_this_host: bool = False
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
        launcher_class = _load(self.launcher)
        return launcher_class(spec)

    def free_ranks(self, spec: AttemptSpec, held: int = 0) -> int:
        """`capacity`'s answer: how many ranks the cluster could run now (elastic runs)."""
        if self.capacity is None:
            raise ValueError(f"the {self.name!r} engine cannot count its free slots")
        return int(_load(self.capacity)(spec, held))

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


#: every engine by name, in `auto`'s order; hora's own are read from ENGINE_PACKAGES on first use
_registry: dict[str, Engine] = {}


def _engines() -> dict[str, Engine]:
    if not _registry:
        for package in ENGINE_PACKAGES:
            engine = _declared(package)
            _registry.setdefault(engine.name, engine)
    return _registry


def register(engine: Engine, override: bool = False) -> None:
    """Add `engine` (a third party's: no edit of hora needed), before this machine's engine in
    `auto`'s order. A name already taken is refused unless `override`, which replaces that
    engine in its place."""
    if not isinstance(engine, Engine):
        raise TypeError(f"register() takes a hora.engines.Engine, got {engine!r}")
    if not isinstance(engine.name, str) or not engine.name or engine.name == "auto":
        raise ValueError(f"an engine needs a name other than 'auto', got {engine.name!r}")
    table = _engines()
    if engine.name in table:
        if not override:
            raise ValueError(
                f"an engine named {engine.name!r} is registered already: choose another name, "
                "or pass override=True to replace it"
            )
        table[engine.name] = engine
        return
    ordered = list(table.values())
    at = next((i for i, e in enumerate(ordered) if e.on_this_host), len(ordered))
    ordered.insert(at, engine)
    table.clear()
    table.update((e.name, e) for e in ordered)


def unregister(name: str) -> None:
    """Remove the engine called `name` (a KeyError names the others)."""
    table = _engines()
    if name not in table:
        raise KeyError(f"no engine is called {name!r}; the engines are {names()}")
    del table[name]


def engines() -> Iterator[Engine]:
    """Every engine, in `auto`'s order."""
    yield from list(_engines().values())


def names() -> tuple[str, ...]:
    return tuple(_engines())


def get(name: str) -> Engine:
    """The engine called `name`; a ValueError lists the others."""
    found = _engines().get(name) if isinstance(name, str) else None
    if found is None:
        raise ValueError(f"backend must be one of {names()}, got {name!r}")
    return found


def active(*, cluster_only: bool = False) -> Engine | None:
    """The first engine whose cluster is at hand; with `cluster_only`, never this machine's."""
    for engine in engines():
        if cluster_only and engine.on_this_host:
            continue
        if engine.is_active():
            return engine
    return None


def for_cluster() -> str:
    """HorovodRunner's `np > 0`: the cluster the program has started, else the first cluster
    engine, whose launcher then says what it needs (a SparkSession)."""
    found = active(cluster_only=True)
    if found is None:
        found = next(e for e in engines() if not e.on_this_host)
    return found.name


def resolve(backend: str) -> str:
    """`auto` becomes the first active engine's name; any other name must be an engine's."""
    if backend == "auto":
        found = active()
        return found.name if found else DEFAULT
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
