"""Engines that other distributions declare: the `hora.engines` entry-point group.

A third party's package says, in its pyproject,

    [project.entry-points."hora.engines"]
    myengine = "my_package.hora_engine:ENGINE"

and `backend="myengine"` (`hora.run`, `Runner`, `hora run --backend myengine`) finds it: no
import of the package and no `register()` call in the user's program. The entry point loads to
an `Engine`, or to a callable returning one, whose name is the entry point's.

The group is read once, when the registry is first asked, never at `import hora`; an entry point
that does not load is kept as a `BrokenEntryPoint`, whose message (naming the distribution and
the entry point) is the error of a run that asks for it, and no other run's.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from hora.engines.declaration import Engine

GROUP = "hora.engines"


@dataclass(frozen=True)
class BrokenEntryPoint:
    """An entry point of the group that gave no usable engine, and why."""

    name: str
    value: str  # "module:attribute", as the distribution declares it
    distribution: str  # "name version", or "an unknown distribution"
    why: str

    def message(self) -> str:
        return (
            f"the engine entry point {self.name!r} ({self.name} = {self.value!r} in the "
            f"{GROUP!r} group of {self.distribution}) cannot be used: {self.why}. Fix or "
            f"uninstall that distribution."
        )


def _distribution(entry_point: metadata.EntryPoint) -> str:
    dist = getattr(entry_point, "dist", None)  # None for an entry point built by hand
    if dist is None:
        return "an unknown distribution"
    return f"the distribution {dist.metadata['Name']} {dist.version}"


def _engine_of(entry_point: metadata.EntryPoint) -> Engine:
    """The engine the entry point declares; raises with what is wrong."""
    loaded = entry_point.load()
    engine = loaded if isinstance(loaded, Engine) or not callable(loaded) else loaded()
    if not isinstance(engine, Engine):
        raise TypeError(
            f"it loads to {type(engine).__name__}, not a hora.engines.Engine (or a callable "
            "returning one)"
        )
    if engine.name != entry_point.name:
        raise ValueError(
            f"it declares an engine named {engine.name!r}: the entry point's name must be the "
            "engine's"
        )
    return engine


def discover(taken: tuple[str, ...]) -> tuple[list[Engine], list[BrokenEntryPoint]]:
    """Every engine of the group, in the order of its names, and the entry points that gave
    none; a name in `taken` (hora's own engines, or one registered already) is refused."""
    found: list[Engine] = []
    broken: list[BrokenEntryPoint] = []
    seen = set(taken)
    for entry_point in sorted(metadata.entry_points(group=GROUP), key=lambda e: e.name):
        try:
            if entry_point.name == "auto":
                raise ValueError("'auto' names no engine: it picks the first active one")
            if entry_point.name in seen:
                raise ValueError(f"an engine named {entry_point.name!r} is registered already")
            engine = _engine_of(entry_point)
        except Exception as error:  # a third party's import: any error is its to fix
            why = f"{type(error).__name__}: {error}"
            distribution = _distribution(entry_point)
            broken.append(BrokenEntryPoint(entry_point.name, entry_point.value, distribution, why))
            continue
        seen.add(engine.name)
        found.append(engine)
    return found, broken
