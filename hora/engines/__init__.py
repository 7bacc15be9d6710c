"""The engines that can run a job, in one registry: adding one means adding one module.

Each engine module declares an `Engine` (`ENGINE = Engine(...)`): its name, how it knows it is
active (for `backend="auto"`), the options it takes and how it builds the launcher of one attempt.
`RunConfig`, the doors and the CLI ask this registry, so none of them lists engines itself.
Engine modules import their framework (pyspark, ray) only when a launcher is built, so asking
whether an engine is active never imports one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hora.config import RunConfig
    from hora.launchers._base import Launcher

#: Where the engines live. The order is `auto`'s: the first active engine wins, so a cluster the
#: program has started (a SparkSession, then `ray.init()`) is preferred to this machine.
ENGINE_MODULES = ("hora.spark._engine", "hora.ray._engine", "hora.launchers.local")

#: (config, use_gpu, restart) -> the launcher of one attempt; it checks the engine first
MakeLauncher = Callable[["RunConfig", "bool | None", bool], "Launcher"]


@dataclass(frozen=True)
class Engine:
    """One engine as the doors see it."""

    name: str
    #: whether the program has this engine's cluster at hand (`auto`); never imports a framework
    is_active: Callable[[], bool]
    make_launcher: MakeLauncher
    #: the options it takes (`engine_options=`), name -> what it means
    options: Mapping[str, str] = field(default_factory=dict)
    #: turns the user's `engine_options` into the engine's own (defaults filled in), or raises
    #: ValueError saying what to change
    check_options: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    #: whether every rank runs on this machine (a script then need not exist elsewhere)
    on_this_host: bool = False
    #: for `hora run --backend NAME`: a context that starts and stops the engine's cluster
    #: connection (a SparkSession, `ray.init()`); None when the engine needs none
    cli_session: Callable[[], AbstractContextManager[None]] | None = None
    #: one line for `hora run --help`
    summary: str = ""


def _load(module: str) -> Engine:
    engine = importlib.import_module(module).ENGINE
    if not isinstance(engine, Engine):
        raise TypeError(f"{module}.ENGINE is not a hora.engines.Engine")
    return engine


def engines() -> Iterator[Engine]:
    """Every engine, in `auto`'s order."""
    for module in ENGINE_MODULES:
        yield _load(module)


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
