"""The engines that can run a job, in one open registry, and everything an engine author needs.

An engine is one folder here, a third party's `register(Engine(...))`, or a distribution's entry
point in the `hora.engines` group (`entry_points`); nothing above this package names one.

Each engine package (`hora.engines.local`, `.spark`, `.ray`) declares an `Engine` in its
`__init__` (its public face, the only module of it the doors import): its name, how it knows it
is active (for `backend="auto"`), the options it takes, where its launcher lives (its
`launcher` module) and what a rank runs first. The declaration imports nothing heavy: the
launcher's module (and with it pyspark or ray) is imported only when a launcher is built, so
`RunConfig(np=2)` or asking whether Spark is active never loads an engine. `RunConfig`, the
doors and the CLI ask this registry.

Words: the public keyword is `backend=` (Horovod's and pyspark's); inside hora, an `Engine` is
what runs ranks, and `backend` is only ever its name.

This module is also the engine author's one import (docs/engines.md), and hora's own engines
import nothing else of hora (tests/test_layout.py): the contract (`Launcher`, `AttemptSpec`,
`LaunchContext`, `Capabilities`, `RanksRun`), the messages a launcher reports (`Output`,
`Exited`, `EngineFailed`) and the `Boot` a worker reads, a rank's place and environment
(`placements`, `host_order`, `joining_order`, `worker_env`, `cuda_devices`), its process
(`WorkerProcess`, `stop_all`), the torch store a launcher hosts (`host_store`), a cluster rank's
supervisor (`supervised_worker`) and the channel it talks on (`Server`, `connect`, `ALLOWED`,
the messages `TaskReady`, `Plan`, `Go`, `Refuse`, `Stop`), and what of the driver's code goes to
ranks elsewhere (`hora_zip`, `rank_pythonpath`, `ships`).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator, Mapping
from typing import Any

from hora._shipping import hora_package_dir, hora_zip, is_users_module, rank_pythonpath, ships
from hora.engines.base import AttemptSpec, LaunchContext, Launcher, most_ranks
from hora.engines.capabilities import Capabilities, RanksRun
from hora.engines.declaration import Engine
from hora.engines.entry_points import GROUP, BrokenEntryPoint, discover
from hora.engines.process import STOP_GRACE_SECONDS, WorkerProcess, describe_exit, stop_all
from hora.engines.rendezvous import host_store
from hora.engines.supervisor import SupervisedWorker, supervised_worker
from hora.environment.build import worker_env
from hora.environment.gpus import cuda_devices
from hora.placement import RankPlacement, host_order, joining_order, placements
from hora.wire.channel import Connection, Server, allowed_classes, connect, derived_key
from hora.wire.protocol import (
    ALLOWED,
    Boot,
    EngineFailed,
    Exited,
    Go,
    Output,
    Plan,
    Refuse,
    Stop,
    TaskReady,
)

__all__ = [
    "ALLOWED",
    "DEFAULT",
    "ENGINE_PACKAGES",
    "GROUP",
    "STOP_GRACE_SECONDS",
    "AttemptSpec",
    "Boot",
    "BrokenEntryPoint",
    "Capabilities",
    "Connection",
    "Engine",
    "EngineFailed",
    "Exited",
    "Go",
    "LaunchContext",
    "Launcher",
    "Output",
    "Plan",
    "RankPlacement",
    "RanksRun",
    "Refuse",
    "Server",
    "Stop",
    "SupervisedWorker",
    "TaskReady",
    "WorkerProcess",
    "active",
    "allowed_classes",
    "broken",
    "check_options",
    "connect",
    "cuda_devices",
    "derived_key",
    "describe_exit",
    "engines",
    "for_cluster",
    "get",
    "hora_package_dir",
    "hora_zip",
    "host_order",
    "host_store",
    "is_users_module",
    "joining_order",
    "most_ranks",
    "names",
    "placements",
    "rank_pythonpath",
    "register",
    "resolve",
    "ships",
    "stop_all",
    "supervised_worker",
    "unregister",
    "worker_env",
]

#: Where hora's own engines are declared. The order is `auto`'s: the first active engine wins,
#: so a cluster the program has started (a SparkSession, then `ray.init()`) is preferred to this
#: machine.
ENGINE_PACKAGES = ("hora.engines.spark", "hora.engines.ray", "hora.engines.local")
#: the engine of this machine, the doors' default (`np < 0`, `local_mode=True`, `hora run`)
DEFAULT = "local"


def _declared(package: str) -> Engine:
    engine = importlib.import_module(package).ENGINE
    if not isinstance(engine, Engine):
        raise TypeError(f"{package}.ENGINE is not a hora.engines.Engine")
    return engine


#: the entry points that gave no engine, by name: asking for one raises its message
_broken: dict[str, BrokenEntryPoint] = {}


@functools.cache
def _engines() -> dict[str, Engine]:
    """Every engine by name, in `auto`'s order: filled once, on first use, from ENGINE_PACKAGES
    and the entry points; `register` and `unregister` change it in place."""
    table: dict[str, Engine] = {}
    for package in ENGINE_PACKAGES:
        engine = _declared(package)
        table.setdefault(engine.name, engine)
    found, broken_ones = discover(tuple(table))
    _broken.update((b.name, b) for b in broken_ones)
    for engine in found:
        _insert(table, engine)
    return table


def _insert(table: dict[str, Engine], engine: Engine) -> None:
    """Add `engine` before this machine's engine in `auto`'s order."""
    ordered = list(table.values())
    at = next((i for i, e in enumerate(ordered) if e.ranks_run is RanksRun.HERE), len(ordered))
    ordered.insert(at, engine)
    table.clear()
    table.update((e.name, e) for e in ordered)


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
    _broken.pop(engine.name, None)  # a program's own engine replaces a broken entry point
    _insert(table, engine)


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
    """Every engine's name, in `auto`'s order."""
    return tuple(_engines())


def broken() -> dict[str, str]:
    """The entry points of the `hora.engines` group that gave no engine: name -> why, as a run
    that asks for one is told (the CLI lists them)."""
    _engines()
    return {name: entry.message() for name, entry in _broken.items()}


def get(name: str) -> Engine:
    """The engine called `name`; a ValueError lists the others."""
    found = _engines().get(name) if isinstance(name, str) else None
    if found is None and name in _broken:
        raise ValueError(_broken[name].message())
    if found is None:
        raise ValueError(f"backend must be one of {names()}, got {name!r}")
    return found


def active(*, cluster_only: bool = False) -> Engine | None:
    """The first engine whose cluster is at hand; with `cluster_only`, never this machine's."""
    for engine in engines():
        if cluster_only and engine.ranks_run is RanksRun.HERE:
            continue
        if engine.is_active():
            return engine
    return None


def for_cluster() -> str:
    """HorovodRunner's `np > 0`: the cluster the program has started, else the first cluster
    engine, whose launcher then says what it needs (a SparkSession)."""
    found = active(cluster_only=True)
    if found is None:
        found = next(e for e in engines() if e.ranks_run is not RanksRun.HERE)
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
