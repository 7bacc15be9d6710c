"""Turn the user's function and arguments into bytes, and say exactly what could not be pickled.

cloudpickle's own error ("cannot pickle '_thread.lock' object") names a type, not the culprit; a
user with a `SummaryWriter` captured in a closure needs the variable's name to fix it.
"""

from __future__ import annotations

import io
import pickle
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle

from hora import _sources
from hora.errors import UnpicklableError

_MAX_DEPTH = 4


def dumps_job(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    by_value: Callable[[Any], bool] | None = None,
) -> bytes:
    """Pickle `(fn, args, kwargs)`, raising `UnpicklableError` that names the culprit.

    The lines of the code pickled by value travel along (`hora._sources`), so the ranks'
    tracebacks show them. `by_value(module)` picks the modules whose functions and classes are
    pickled by value, not by name (a notebook's own modules, which the ranks cannot import)."""
    try:
        pickler = _Pickler(by_value)
        data = pickler.dump_all((fn, args, kwargs))
    except Exception as exc:
        name = getattr(fn, "__qualname__", repr(fn))
        parts = [(f"function {name}", fn)]
        parts += [(f"positional argument {i}", a) for i, a in enumerate(args)]
        parts += [(f"argument {k!r}", v) for k, v in kwargs.items()]
        path = _culprit_path(parts) or [(f"function {name}", fn)]
        raise UnpicklableError(
            f"hora cannot send {name} to the workers: {_describe(path)} cannot be pickled "
            f"({type(exc).__name__}: {exc}). Create such objects inside the function, on each "
            "worker, instead of capturing them from the driver or passing them as arguments."
        ) from exc
    sources = _sources.lines_of(pickler.files)
    if not sources:
        return data
    return pickle.dumps(_WithSources(data, sources), protocol=pickle.HIGHEST_PROTOCOL)


def _loads_with_sources(data: bytes, sources: _sources.Sources) -> Any:
    """On a rank: register the driver's lines, then unpickle the job (a plain tuple)."""
    _sources.register(sources)
    return cloudpickle.loads(data)


class _WithSources:
    """A job whose unpickling registers its code's lines first (`_loads_with_sources`)."""

    def __init__(self, data: bytes, sources: _sources.Sources):
        self.data, self.sources = data, sources

    def __reduce__(self) -> tuple[Any, ...]:
        return (_loads_with_sources, (self.data, self.sources))


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, noting the file of every code object it pickles (by value), and pickling by
    value the modules `by_value` picks, as it meets them."""

    def __init__(self, by_value: Callable[[Any], bool] | None):
        self._buffer = io.BytesIO()
        super().__init__(self._buffer, protocol=pickle.HIGHEST_PROTOCOL)
        self.files: set[str] = set()
        self._by_value = by_value
        self._registered: list[str] = []
        self._refused: set[str] = set()

    def dump_all(self, obj: Any) -> bytes:
        try:
            self.dump(obj)
        finally:
            for name in self._registered:
                cloudpickle.unregister_pickle_by_value(_module(name))
        return self._buffer.getvalue()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.CodeType):
            self.files.add(obj.co_filename)
            return _code_reduce(obj)
        if self._by_value is not None:
            self._note_module(obj)
        return super().reducer_override(obj)

    def _note_module(self, obj: Any) -> None:
        if isinstance(obj, types.ModuleType):
            module = obj
        elif isinstance(obj, type | types.FunctionType):
            module = _module(getattr(obj, "__module__", None) or "")
        else:
            return
        name = getattr(module, "__name__", None)
        if not name or name in self._registered or name in self._refused:
            return
        if name in cloudpickle.list_registry_pickle_by_value():
            return  # the user's own choice: left as it is
        if self._by_value is not None and self._by_value(module):
            cloudpickle.register_pickle_by_value(module)
            self._registered.append(name)
        else:
            self._refused.add(name)


def _code_reduce(code: types.CodeType) -> Any:
    """cloudpickle's reduction of a code object, with its file's name kept: cloudpickle renames
    every file `<dynamic-code>`, and the rank's traceback could then show no cell's lines."""
    constructor, args = cloudpickle.cloudpickle._code_reduce(code)
    return constructor, tuple(code.co_filename if a == "<dynamic-code>" else a for a in args)


def _module(name: str) -> Any:
    return sys.modules.get(name)


def dumps_result(value: Any, rank: int) -> bytes:
    """Pickle a worker's return value, naming what in it cannot be pickled."""
    try:
        return cloudpickle.dumps(value)
    except Exception as exc:
        inner = (_culprit_path([("the return value", value)]) or [])[1:]
        if inner:
            label, obj = inner[0]
            culprit = f"{_describe([(f'its {label}', obj), *inner[1:]])} is not picklable"
        else:
            culprit = f"it is {_a(value)}"
        # The cause's text is in the message; its frames (cloudpickle's) would only bury it.
        raise UnpicklableError(
            f"the return value of rank {rank} cannot be pickled: {culprit} "
            f"({type(exc).__name__}: {exc}). Return plain data (numbers, tensors, state_dicts)."
        ) from None


def _picklable(obj: Any) -> bool:
    try:
        cloudpickle.dumps(obj)
    except Exception:
        return False
    return True


def _culprit_path(parts: list[tuple[str, Any]], depth: int = 0) -> list[tuple[str, Any]] | None:
    """(label, object) from the first unpicklable part down to the deepest unpicklable piece."""
    for label, obj in parts:
        if _picklable(obj):
            continue
        inner = _culprit_path(list(_children(obj)), depth + 1) if depth < _MAX_DEPTH else None
        return [(label, obj), *(inner or [])]
    return None


def _describe(path: list[tuple[str, Any]]) -> str:
    """'key 'w' (a lock) in argument 'state' (a dict)': the culprit first, then where it is. A
    function is named without its type, and only where its pieces' labels do not name it."""
    (label, obj), *outer = reversed(path)
    text = label if label.startswith("function ") else f"{label} ({_a(obj)})"
    for label, obj in outer:
        if not label.startswith("function "):
            text += f" in {label} ({_a(obj)})"
    return text


def _a(obj: Any) -> str:
    """'a lock', 'an Event': the object's type, as a sentence names it."""
    name = type(obj).__qualname__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _children(obj: Any) -> Iterator[tuple[str, Any]]:
    """The named pieces of `obj` that pickling it would pickle too."""
    if isinstance(obj, types.MethodType):
        yield f"the instance bound to {obj.__name__}", obj.__self__
        obj = obj.__func__
    if isinstance(obj, types.FunctionType):
        yield from _function_children(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield f"key {k!r}", v
    elif isinstance(obj, list | tuple | set | frozenset):
        for i, v in enumerate(obj):
            yield f"item {i}", v
    elif hasattr(obj, "__dict__"):
        for k, v in vars(obj).items():
            yield f"attribute {k!r}", v


def _function_children(fn: types.FunctionType) -> Iterator[tuple[str, Any]]:
    """What pickling a function by value takes along: its closure, globals and defaults."""
    cells = fn.__closure__ or ()
    for var, cell in zip(fn.__code__.co_freevars, cells, strict=False):
        try:
            yield f"variable {var!r} captured by {fn.__name__}", cell.cell_contents
        except ValueError:  # empty cell
            continue
    for var in fn.__code__.co_names:
        if var in fn.__globals__ and not isinstance(fn.__globals__[var], types.ModuleType):
            yield f"global {var!r} used by {fn.__name__}", fn.__globals__[var]
    for i, default in enumerate(fn.__defaults__ or ()):
        yield f"default {i} of {fn.__name__}", default
