"""The house's layout, enforced: every module imports alone, and every arrow points down.

After Ray Train's `tests/test_circular_imports.py`, and more. Two readings of hora/:
- **Each module imported alone**, in one subprocess: before each module every `hora*` entry is
  dropped from sys.modules and `hora` itself is an empty shell, so a module gets only what it
  imports itself (hora/__init__.py's import order cannot hide a circle). A module fails on an
  import error, or when it loads, even dynamically, a module of another room on its floor or
  higher; a module whose optional framework is missing is skipped with the reason.
- **Every import statement read (ast)**, module-level, inside functions and under
  `if TYPE_CHECKING:` (a type-only arrow is an arrow too: it ties the modules as much). It fails
  on an import circle between modules, an arrow up the floors, a private name imported from
  outside the package that owns it, and a function-level import of a hora module that is not in
  `FUNCTION_LEVEL_IMPORTS` with its reason; inside hora.collectives, an arrow up its own rooms
  (`COLLECTIVES_ROOMS`: the control room above the data room, which never imports it).
- **Engines named only in `hora/engines/`**: outside it, no module imports an engine package's
  inner modules (only its face, its `__init__`, and only from the doors `ENGINE_DOORS` lists),
  and no code spells an engine's name ("spark"): the registry and the faces say it.
- **The launcher's contract, declared**: outside `hora/engines/`, no `getattr`/`hasattr` reads a
  name that `hora.engines.base.Launcher` or its `Capabilities` declare (every launcher has it,
  with its default).
- **hora's engines on the public face**: every module of an engine package imports of hora only
  the face, `hora.engines`, and its own package (as the tests' toy engine does): an engine
  author's one import is enough for hora's own.
- **Small modules**: none of hora/ over `MOST_LINES` (450) lines.

`python tests/test_layout.py` prints every finding without pytest.
"""

from __future__ import annotations

import ast
import itertools
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "hora"

#: The floors, highest first. A "room" is `hora.<first component>` (`hora` alone is the package's
#: `__init__`). A module may import the modules of its own room and those of rooms on strictly
#: lower floors. Two stacks share the building: doors -> job -> engines -> wire/environment, and
#: framework APIs -> collectives -> timeline -> wire.
FLOORS: dict[int, tuple[str, ...]] = {
    10: ("hora.__main__",),  # `python -m hora`: runs the command line, so it sits above it
    9: ("hora", "hora.cli"),  # the package's face and the command line
    8: ("hora.api", "hora.spark", "hora.serverless"),  # the doors
    # the driver's lifecycle (launch, group, monitor, policy, restarts) and its twin, a rank's
    # (the bootstrap every worker runs, its stacks); neither imports the other
    7: ("hora.job", "hora.rank"),
    6: ("hora.config", "hora._script", "hora.keras"),  # the one RunConfig; a script as a job
    5: ("hora.torch", "hora.tensorflow"),  # Horovod's framework APIs
    4: ("hora.collectives", "hora.engines"),  # the collectives; the engines that run ranks
    3: (
        "hora.timeline",  # the trace
        "hora.checkpoint",
        "hora.data",
        # a rank's half of an elastic run's talk with its driver (hora.job.world's twin), which
        # the collectives reach through their one hook to the driver (collectives._driver)
        "hora.elastic",
    ),
    2: (
        "hora.environment",
        "hora._payload",
        "hora._shipping",  # what of the driver's code goes to a cluster's ranks
        "hora._output_files",
        "hora._deepspeed_ops",
        "hora.reporters",
        "hora.storage",  # where files live: one face (Location), one atomic writer
    ),
    1: (
        "hora.wire",  # how processes talk: imports nothing of hora but hora.errors, placement
        "hora._sources",  # the lines of the code a payload ships, for the ranks' tracebacks
    ),
    0: (
        "hora.errors",
        "hora._version",  # the one version: the package, `hora --version`, the executors' check
        "hora.placement",  # where ranks sit: the driver's orders, the wire and the collectives
    ),
}
FLOOR_OF_ROOM = {room: floor for floor, rooms in FLOORS.items() for room in rooms}

#: Inside hora.collectives, the same rule between its own rooms, highest first (after Horovod's
#: core: the loop and negotiation apart from the data ops): (room, its modules, what lives
#: there). Every other module of the package (its faces, `_basics`) is its front, above them all.
COLLECTIVES_ROOMS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("control", ("hora.collectives._control",), "the loop, negotiation, submissions"),
    ("data", ("hora.collectives._data",), "transports, shared memory, fusion, the ops and specs"),
    ("words", ("hora.collectives._common", "hora.collectives._messages"), "ops, errors, messages"),
)
COLLECTIVES_LEVEL = {"front": len(COLLECTIVES_ROOMS)} | {
    room: len(COLLECTIVES_ROOMS) - 1 - i for i, (room, _, _) in enumerate(COLLECTIVES_ROOMS)
}

#: The only function-level imports of hora modules, (importer, imported) -> why it cannot be at
#: the top. Anything else belongs at the top of its module, where readers and tools see it.
FUNCTION_LEVEL_IMPORTS: dict[tuple[str, str], str] = {
    ("hora.engines.spark.entry", "hora.engines.spark.task"): (
        "entry is shipped to Spark's executors by value and must load where hora cannot be "
        "imported, to say why; it imports hora's task supervisor only once the executor's "
        "Python is known to match the driver's"
    ),
    ("hora.spark", "hora.spark.estimator"): (
        "TorchEstimator and TorchModel import pyspark.ml (seconds); `from hora.spark import "
        "TorchDistributor` must not pay for them (a module __getattr__)"
    ),
    ("hora.spark", "hora.spark._petastorm"): (
        "Petastorm's door imports hora.data (pyarrow, torch): `from hora.spark import "
        "TorchDistributor` must not pay for it (a module __getattr__)"
    ),
    ("hora.spark.estimator.train", "hora.torch"): (
        "the driver and TorchModel's inference tasks import train.py too (TrainJob, the "
        "forward/loss step); only a training rank needs hora.torch and torch.distributed"
    ),
}

#: The doors outside hora/engines/ that may import an engine's face, face -> {room: why}.
ENGINE_DOORS: dict[str, dict[str, str]] = {
    "hora.engines.spark": {
        "hora.spark": (
            "pyspark's own doors (TorchDistributor, MirroredStrategyRunner, the estimator) are "
            "the Spark engine's: they ask its face for the active session and its slots"
        ),
    },
}


# ---------------------------------------------------------------------------------------------
# The tree


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of hora, name -> file."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def is_package(name: str) -> bool:
    return modules()[name].name == "__init__.py"


def room_of(name: str) -> str:
    return ".".join(name.split(".")[:2])


def floor_of(name: str) -> int | None:
    """The floor of `name`'s room; None for a room FLOORS does not list (a finding of its own)."""
    return FLOOR_OF_ROOM.get(room_of(name))


def is_private(component: str) -> bool:
    return component.startswith("_") and not (
        component.startswith("__") and component.endswith("__")
    )


# ---------------------------------------------------------------------------------------------
# Reading the imports


@dataclass(frozen=True)
class Import:
    """One arrow: line `line` of `importer` imports the module `target`, or `names` from it."""

    importer: str
    target: str
    names: tuple[str, ...]
    line: int
    in_function: bool
    #: an attribute read on an imported module (`ops._group(...)`), not an import statement
    read: bool = False
    #: under `if TYPE_CHECKING:`: for the type checker only, but an arrow all the same
    type_only: bool = False

    @property
    def where(self) -> str:
        return f"{modules()[self.importer].relative_to(REPO)}:{self.line}"

    @property
    def imported(self) -> str:
        what = f"{', '.join(self.names)} from {self.target}" if self.names else self.target
        return what + (" (under TYPE_CHECKING)" if self.type_only else "")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(
    node: ast.AST, in_function: bool = False, type_only: bool = False
) -> Iterator[tuple[ast.AST, bool, bool]]:
    """Every import statement and attribute read under `node`, whether it runs inside a
    function, and whether it is for the type checker only (under `if TYPE_CHECKING:`)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom | ast.Attribute):
            yield child, in_function, type_only
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield from _statements(_module(stmt), in_function, True)
            for stmt in child.orelse:
                yield from _statements(_module(stmt), in_function, type_only)
        else:
            inside = in_function or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            )
            yield from _statements(child, inside, type_only)


def _module(stmt: ast.stmt) -> ast.Module:
    return ast.Module(body=[stmt], type_ignores=[])


def _absolute(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = importer if is_package(importer) else importer.rpartition(".")[0]
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def _resolved(importer: str, node: ast.Import | ast.ImportFrom) -> Iterator[tuple[str, str, str]]:
    """(module, attribute or "", the local name it is bound to) for each alias."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name, "", alias.asname or ""  # `import a.b` binds `a`: no module alias
        return
    source = _absolute(importer, node)
    for alias in node.names:
        local = alias.asname or alias.name
        if f"{source}.{alias.name}" in modules():
            yield f"{source}.{alias.name}", "", local
        else:
            yield source, "" if alias.name == "*" else alias.name, local


@cache
def imports_of(importer: str) -> tuple[Import, ...]:
    """The imports of hora modules in `importer`, each resolved to a module and names from it.
    A private attribute read on an imported module (`ops._group(...)`) counts as importing it."""
    tree = ast.parse(modules()[importer].read_text(), str(modules()[importer]))
    found: list[Import] = []
    bound: dict[str, str] = {}  # local name -> the hora module it is
    for node, in_function, type_only in _statements(tree):
        if isinstance(node, ast.Attribute):
            value = node.value
            if isinstance(value, ast.Name) and value.id in bound and is_private(node.attr):
                target = bound[value.id]
                found.append(
                    Import(
                        importer, target, (node.attr,), node.lineno, in_function, True, type_only
                    )
                )
            continue
        by_target: dict[str, list[str]] = {}
        for target, attribute, local in _resolved(importer, node):
            if target.split(".")[0] != "hora":
                continue
            by_target.setdefault(target, [])
            if attribute:
                by_target[target].append(attribute)
            elif local:
                bound[local] = target
        for target, names in by_target.items():
            found.append(
                Import(importer, target, tuple(names), node.lineno, in_function, False, type_only)
            )
    return tuple(found)


def every_import() -> Iterator[Import]:
    for name in modules():
        yield from imports_of(name)


# ---------------------------------------------------------------------------------------------
# The rules, each returning what breaks it in words a newcomer can act on


def rooms_without_a_floor() -> list[str]:
    rooms = {room_of(name) for name in modules()}
    found = [
        f"FLOORS names {room}, which hora/ no longer has: remove it."
        for room in sorted(set(FLOOR_OF_ROOM) - rooms)
    ]
    for room in sorted(rooms - set(FLOOR_OF_ROOM)):
        arrows = list(every_import())
        below = [floor_of(a.target) for a in arrows if room_of(a.importer) == room]
        above = [floor_of(a.importer) for a in arrows if room_of(a.target) == room]
        lowest = max((f + 1 for f in below if f is not None), default=0)
        highest = min((f - 1 for f in above if f is not None), default=max(FLOORS))
        fits = f"floors {lowest} to {highest} fit it" if lowest <= highest else "no floor fits it"
        found.append(f"{room} has no floor in FLOORS: add it ({fits}, by its imports).")
    return found


def upward_arrows() -> list[str]:
    found = []
    for arrow in every_import():
        if room_of(arrow.importer) == room_of(arrow.target):
            continue
        mine, theirs = floor_of(arrow.importer), floor_of(arrow.target)
        if mine is None or theirs is None:
            continue  # rooms_without_a_floor reports it
        if theirs >= mine:
            found.append(
                f"{arrow.where}: {arrow.importer} (floor {mine}) imports {arrow.imported} "
                f"(floor {theirs}): an arrow {'up' if theirs > mine else 'across'} the floors. "
                "Move what it needs down, pass it in from above, or (if the house changed) "
                "move the room in FLOORS and say why."
            )
    return found


def collectives_room(name: str) -> str | None:
    """The room of `name` inside hora.collectives ("front" for its faces), None outside it."""
    if name != "hora.collectives" and not name.startswith("hora.collectives."):
        return None
    for room, prefixes, _ in COLLECTIVES_ROOMS:
        if any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes):
            return room
    return "front"


def collectives_arrows() -> list[str]:
    """Inside hora.collectives: the front above the control room, above the data room, above the
    shared words; the data room never imports the control room, nothing below imports the
    front."""
    found = []
    for arrow in every_import():
        mine, theirs = collectives_room(arrow.importer), collectives_room(arrow.target)
        if mine is None or theirs is None or mine == theirs:
            continue
        if COLLECTIVES_LEVEL[theirs] >= COLLECTIVES_LEVEL[mine]:
            found.append(
                f"{arrow.where}: {arrow.importer} ({mine}) imports {arrow.imported} ({theirs}): "
                "inside hora.collectives the arrows run front -> control -> data -> words "
                "(COLLECTIVES_ROOMS). Move what it needs down (a type the data room needs lives "
                "there; a Protocol where the room below only calls it), or pass it in from above."
            )
    return found


def _owner(module: str) -> str:
    """The package that owns `module`'s own names: itself if it is a package, else its parent."""
    return module if is_package(module) else module.rpartition(".")[0]


def _private_owner(arrow: Import) -> str | None:
    """The package whose private name `arrow` reaches, or None. A private name is visible in
    the package that holds it and that package's subpackages."""
    parts = arrow.target.split(".")
    for index, part in enumerate(parts):
        if is_private(part):
            return _owner(".".join(parts[:index]))
    return _owner(arrow.target) if any(is_private(n) for n in arrow.names) else None


def private_crossings() -> list[str]:
    found = []
    for arrow in every_import():
        owner = _private_owner(arrow)
        if owner is None or arrow.importer == owner or arrow.importer.startswith(owner + "."):
            continue
        private = [n for n in arrow.names if is_private(n)]
        what = f"{', '.join(private)} from {arrow.target}" if private else arrow.target
        found.append(
            f"{arrow.where}: {arrow.importer} {'reads' if arrow.read else 'imports'} "
            f"{what}, private to {owner}. Use {owner}'s public face (its __init__ or "
            "a public module) and, if what you need is not there, add it there."
        )
    return found


def unlisted_function_imports() -> list[str]:
    return [
        f"{arrow.where}: {arrow.importer} imports {arrow.imported} inside a function. Move it to "
        "the top of the module; if it must stay (a heavy import kept out of a light module, code "
        "that runs where hora is not installed), add it to FUNCTION_LEVEL_IMPORTS with the reason."
        for arrow in every_import()
        if arrow.in_function
        and not arrow.read
        and (arrow.importer, arrow.target) not in FUNCTION_LEVEL_IMPORTS
    ]


def stale_allowances() -> list[str]:
    present = {(a.importer, a.target) for a in every_import() if a.in_function and not a.read}
    return [
        f"FUNCTION_LEVEL_IMPORTS lists {importer} -> {target}, which no function imports any more: "
        "remove the entry."
        for importer, target in FUNCTION_LEVEL_IMPORTS
        if (importer, target) not in present
    ]


def import_graph() -> dict[str, dict[str, Import]]:
    """importer -> {module it makes Python import -> the import statement}. Importing
    `hora.a.b.c` from outside `hora.a` also runs `hora/a/__init__.py` and `hora/a/b/__init__.py`;
    those arrows are in the graph too (never `hora` itself, which every module has)."""
    graph: dict[str, dict[str, Import]] = {name: {} for name in modules()}
    for arrow in every_import():
        parts = arrow.target.split(".")
        for end in range(2, len(parts) + 1):
            reached = ".".join(parts[:end])
            inside = arrow.importer == reached or arrow.importer.startswith(reached + ".")
            if reached in modules() and not inside:
                graph[arrow.importer].setdefault(reached, arrow)
    return graph


def _cycle_through(start: str, members: set[str], graph: dict[str, dict[str, Import]]) -> list:
    """A shortest path start -> ... -> start inside one strongly connected component."""
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for successor in sorted(graph[node]):
            if successor == start:
                return paths[node] + [start]
            if successor in members and successor not in paths:
                paths[successor] = paths[node] + [successor]
                queue.append(successor)
    raise AssertionError(f"no cycle through {start}")


def components(graph: dict[str, dict[str, Import]]) -> list[set[str]]:
    """Tarjan's strongly connected components with more than one module."""
    tarjan = _Tarjan(graph)
    for node in sorted(graph):
        if node not in tarjan.index:
            tarjan.visit(node)
    return tarjan.found


class _Tarjan:
    def __init__(self, graph: dict[str, dict[str, Import]]) -> None:
        self.graph = graph
        self.index: dict[str, int] = {}
        self.low: dict[str, int] = {}
        self.stack: list[str] = []
        self.on_stack: set[str] = set()
        self.found: list[set[str]] = []

    def visit(self, node: str) -> None:
        self.index[node] = self.low[node] = len(self.index)
        self.stack.append(node)
        self.on_stack.add(node)
        for successor in self.graph[node]:
            if successor not in self.index:
                self.visit(successor)
                self.low[node] = min(self.low[node], self.low[successor])
            elif successor in self.on_stack:
                self.low[node] = min(self.low[node], self.index[successor])
        if self.low[node] == self.index[node]:
            self._pop_component(node)

    def _pop_component(self, root: str) -> None:
        member: set[str] = set()
        while True:
            top = self.stack.pop()
            self.on_stack.discard(top)
            member.add(top)
            if top == root:
                break
        if len(member) > 1:
            self.found.append(member)


def circles() -> list[str]:
    graph = import_graph()
    found = []
    for members in components(graph):
        cycle = _cycle_through(min(members), members, graph)
        steps = "\n".join(
            f"  {a} -> {b}   ({graph[a][b].where}"
            f"{', in a function' if graph[a][b].in_function else ''}"
            f"{', under TYPE_CHECKING' if graph[a][b].type_only else ''})"
            for a, b in itertools.pairwise(cycle)
        )
        found.append(
            f"an import circle among {len(members)} modules ({', '.join(sorted(members))}), "
            f"for example:\n{steps}\nBreak it: move what both ends need into a module below "
            "them both, or pass it in as an argument; a function-level import only hides it."
        )
    return found


ENGINES = "hora.engines"


def engine_packages() -> list[str]:
    """hora.engines' subpackages: one engine each, its `__init__` its face."""
    return [
        name
        for name in modules()
        if name.startswith(ENGINES + ".") and name.count(".") == 2 and is_package(name)
    ]


def engine_names() -> dict[str, str]:
    """Each engine's name as its face declares it (`ENGINE = Engine(name="spark", ...)`)."""
    found = {}
    for package in engine_packages():
        for node in ast.walk(ast.parse(modules()[package].read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Engine":
                for keyword in node.keywords:
                    if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                        found[keyword.value.value] = package
    return found


def _spelled_names(tree: ast.AST) -> Iterator[ast.Constant]:
    """The string constants of code: not docstrings, dict keys, subscripts or `__slots__`."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            skip.add(id(body[0].value))  # a docstring (or a bare string, which is one too)
        if isinstance(node, ast.Dict):
            skip.update(id(key) for key in node.keys if key is not None)
        if isinstance(node, ast.Subscript):
            skip.update(id(n) for n in ast.walk(node.slice))
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
        ):
            skip.update(id(n) for n in ast.walk(node.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node


def engines_named_outside() -> list[str]:
    return engine_imports_outside() + engine_names_spelled_outside()


def engine_imports_outside() -> list[str]:
    packages = engine_packages()
    found = []
    for arrow in every_import():
        if room_of(arrow.importer) == ENGINES:
            continue
        face = next((p for p in packages if arrow.target.startswith(p)), None)
        if face is None:
            continue
        if arrow.target != face and not arrow.target.startswith(face + "."):
            continue
        if arrow.target != face:
            found.append(
                f"{arrow.where}: {arrow.importer} imports {arrow.imported}, inside the engine "
                f"{face}. Import what the doors need from its face ({face}); add it there."
            )
        elif room_of(arrow.importer) not in ENGINE_DOORS.get(face, {}):
            found.append(
                f"{arrow.where}: {arrow.importer} imports the engine {face}: only its own doors "
                "may (ENGINE_DOORS). Ask the registry (hora.engines: get, active, resolve, "
                "DEFAULT) instead, or list the door in ENGINE_DOORS with the reason."
            )
    return found


def engine_names_spelled_outside() -> list[str]:
    names = engine_names()
    found = []
    for name, path in modules().items():
        if room_of(name) == ENGINES:
            continue
        for node in _spelled_names(ast.parse(path.read_text())):
            if node.value in names:
                found.append(
                    f"{path.relative_to(REPO)}:{node.lineno}: {name} spells the engine name "
                    f"{node.value!r}. Ask the registry (hora.engines.DEFAULT, for_cluster(), "
                    f"resolve()) or the engine's face ({names[node.value]}.ENGINE.name)."
                )
    return found


LAUNCHER = ("hora.engines.base", "Launcher")  # the engine author's contract: (module, class)
#: what a launcher says of its attempt, one record (`Launcher.capabilities`): (module, class)
CAPABILITIES = ("hora.engines.capabilities", "Capabilities")


def _declared_members(module: str, name: str) -> set[str]:
    """Every attribute and public method class `name` of `module` declares."""
    tree = ast.parse(modules()[module].read_text())
    found = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    declared: set[str] = set()
    for node in found.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            declared.add(node.target.id)
        elif isinstance(node, ast.Assign):
            declared.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not is_private(node.name):
            declared.add(node.name)
    return declared


@cache
def launcher_contract() -> frozenset[str]:
    """Every attribute and method `hora.engines.base.Launcher` declares, with its default, and
    every field of its `capabilities` record."""
    return frozenset(_declared_members(*LAUNCHER) | _declared_members(*CAPABILITIES))


def launcher_attributes_read_by_getattr() -> list[str]:
    """A launcher's attributes are declared on `hora.engines.base.Launcher` (the engine author's
    contract), each with its default: outside hora/engines/, nothing reads one with
    `getattr(x, "name", default)` or `hasattr(x, "name")` as if it might be missing."""
    contract = launcher_contract()
    found = []
    for name, path in modules().items():
        if room_of(name) == ENGINES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            reader = getattr(getattr(node, "func", None), "id", None)
            if not (isinstance(node, ast.Call) and reader in ("getattr", "hasattr")):
                continue
            named = node.args[1] if len(node.args) >= 2 else None
            if not (isinstance(named, ast.Constant) and named.value in contract):
                continue
            found.append(
                f"{path.relative_to(REPO)}:{node.lineno}: {name} reads {named.value!r} with "
                f"{reader}, but every launcher has it (hora.engines.base.Launcher declares it, "
                "with its default): read it as a plain attribute, and type what you read it on "
                "(a WorkerGroup, a Protocol)."
            )
    return found


def test_the_launcher_contract_is_read_from_its_class() -> None:
    """The rule above is only as good as the list it reads: the contract's known members."""
    known = {"start", "stop", "add", "spare", "capabilities", "grows_in_place", "ranks_run"}
    assert known <= launcher_contract()


#: Engines outside hora/ that are written against `hora.engines` alone, as hora's own are
#: (files of the repository, relative to it)
FACE_ONLY_ENGINES_ELSEWHERE = ("tests/engines/_toy.py",)


def _hora_imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of every import of a hora module in the file at `path`, by its text: a
    `from hora import x` counts as `hora.x` where that is a module."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            inside = [f"{node.module}.{alias.name}" for alias in node.names]
            targets = [t for t in inside if t in modules()] or [node.module]
        else:
            continue
        for target in targets:
            if target == "hora" or target.startswith("hora."):
                yield node.lineno, target


def engines_beside_the_face() -> list[str]:
    """hora's own engines (every module of `hora/engines/<engine>/`) import of hora only the
    engine author's face, `hora.engines`, and their own package's modules, as a third party's
    engine must (docs/engines.md); so does the toy engine of the tests. What an engine needs
    and the face lacks is added to the face (its `__all__`, docs/engines.md), not imported
    from beside it."""
    packages = engine_packages()
    files = {
        path: next(p for p in packages if name == p or name.startswith(p + "."))
        for name, path in modules().items()
        if any(name == p or name.startswith(p + ".") for p in packages)
    }
    files.update({REPO / path: "" for path in FACE_ONLY_ENGINES_ELSEWHERE})
    found = []
    for path, own in files.items():
        for line, target in _hora_imports(path):
            if target == ENGINES or (own and (target == own or target.startswith(own + "."))):
                continue
            found.append(
                f"{path.relative_to(REPO)}:{line}: an engine imports {target}, beside the "
                f"engine author's face. Import it from {ENGINES} (add it to its __all__ and to "
                "docs/engines.md if an engine honestly needs it), or keep it in the engine's "
                "own package."
            )
    return found


#: the most lines a module of hora/ may have: past it, a module does more than one job
MOST_LINES = 450


def modules_too_long() -> list[str]:
    """A module over `MOST_LINES` lines holds more than one job: split it by what it does."""
    found = []
    for name, path in modules().items():
        lines = len(path.read_text().splitlines())
        if lines > MOST_LINES:
            found.append(
                f"{path.relative_to(REPO)}: {name} has {lines} lines, over {MOST_LINES}: "
                "move one of its jobs into a module of its own."
            )
    return found


RULES = {
    "rooms without a floor": rooms_without_a_floor,
    "modules over 450 lines": modules_too_long,
    "circles": circles,
    "upward arrows": upward_arrows,
    "collectives: control above data": collectives_arrows,
    "private names across packages": private_crossings,
    "function-level imports": unlisted_function_imports,
    "stale allow-list entries": stale_allowances,
    "engines named outside hora/engines": engines_named_outside,
    "engines beside the face": engines_beside_the_face,
    "launcher attributes read by getattr": launcher_attributes_read_by_getattr,
}


def report(findings: list[str]) -> str:
    return "\n".join(["", *(f"- {textwrap.indent(f, '  ').lstrip()}" for f in findings)])


@pytest.mark.parametrize("rule", list(RULES))
def test_static_layout(rule: str) -> None:
    findings = RULES[rule]()
    assert not findings, f"{len(findings)} found:{report(findings)}"


# ---------------------------------------------------------------------------------------------
# Each module imported alone

IMPORT_ALONE = """
import importlib, json, sys, traceback, types

package, out, names = sys.argv[1], sys.argv[2], json.loads(sys.stdin.read())
results = {}
for name in names:
    for key in [k for k in sys.modules if k == "hora" or k.startswith("hora.")]:
        del sys.modules[key]
    if name != "hora":
        shell = types.ModuleType("hora")
        shell.__path__ = [package]
        sys.modules["hora"] = shell
    try:
        importlib.import_module(name)
    except ImportError as error:
        missing = getattr(error, "name", None)
        if missing and missing.split(".")[0] != "hora":
            results[name] = {"skipped": f"{missing} is not installed ({error})"}
            continue
        results[name] = {"error": traceback.format_exc()}
        continue
    except BaseException:
        results[name] = {"error": traceback.format_exc()}
        continue
    loaded = sorted(k for k in sys.modules if k.split(".")[0] == "hora" and k != "hora")
    results[name] = {"loaded": loaded}
with open(out, "w") as f:
    json.dump(results, f)
"""


@pytest.fixture(scope="module")
def imported_alone(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """name -> {"loaded": [the hora modules it brought]}, {"skipped": why} or {"error": trace}."""
    out = tmp_path_factory.mktemp("layout") / "imported.json"
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_ALONE, str(PACKAGE), str(out)],
        input=json.dumps(list(modules())),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", list(modules()))
def test_imports_alone(name: str, imported_alone: dict[str, dict]) -> None:
    outcome = imported_alone[name]
    if "skipped" in outcome:
        pytest.skip(outcome["skipped"])
    if "error" in outcome:
        pytest.fail(f"`import {name}` alone fails:\n{outcome['error']}", pytrace=False)
    mine = floor_of(name)
    above = [
        loaded
        for loaded in outcome["loaded"]
        if room_of(loaded) != room_of(name) and mine is not None and (floor_of(loaded) or 0) >= mine
    ]
    assert not above, (
        f"`import {name}` (floor {floor_of(name)}) loads {above}, on its floor or above. "
        "test_static_layout names the import statements that point up; if it names none, an "
        "import it cannot read (importlib.import_module) does: point it down."
    )


if __name__ == "__main__":
    total = 0
    for title, rule in RULES.items():
        findings = rule()
        total += len(findings)
        print(f"{title}: {len(findings)}{report(findings)}\n")
    sys.exit(1 if total else 0)
