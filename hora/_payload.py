"""Turn the user's function and arguments into bytes, and say exactly what could not be pickled.

cloudpickle's own error ("cannot pickle '_thread.lock' object") names a type, not the culprit; a
user with a `SummaryWriter` captured in a closure needs the variable's name to fix it.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle

from hora.errors import UnpicklableError

_MAX_DEPTH = 4


def dumps_job(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """Pickle `(fn, args, kwargs)`, raising `UnpicklableError` that names the culprit."""
    try:
        return cloudpickle.dumps((fn, args, kwargs))
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
