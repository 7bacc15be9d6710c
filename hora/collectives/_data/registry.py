"""Every collective op, found once: each module of `algorithms/` that declares a `SPEC`.

A new op is a new module there (its `run` and its `SPEC`), so nothing here lists the ops: the
control room's tables, the data room's dispatch and the frameworks' public names are all read
from `OPS`.
"""

from __future__ import annotations

import importlib
import pkgutil

from hora.collectives._data import algorithms
from hora.collectives._data.op_spec import FRAMEWORKS, OpSpec


def _discover() -> dict[str, OpSpec]:
    found: dict[str, OpSpec] = {}
    for module in sorted(pkgutil.iter_modules(algorithms.__path__), key=lambda m: m.name):
        spec = getattr(
            importlib.import_module(f"{algorithms.__name__}.{module.name}"), "SPEC", None
        )
        if not isinstance(spec, OpSpec):
            continue
        if spec.kind in found:
            raise RuntimeError(f"two modules of algorithms/ declare the op {spec.kind!r}")
        found[spec.kind] = spec
    return found


#: kind -> its spec, for every op
OPS: dict[str, OpSpec] = _discover()

#: the kinds whose requests keep every rank's own shapes (rank 0 keeps them all)
PER_RANK_KINDS = frozenset(kind for kind, spec in OPS.items() if spec.per_rank_shapes)


def faces(framework: str) -> list[str]:
    """The public names `framework` gives the ops (`op_spec.FRAMEWORKS`), sorted."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {framework!r}; one of {FRAMEWORKS}")
    return sorted(name for spec in OPS.values() for name in spec.faces.get(framework, ()))
