"""Horovod's forms of an op, made from one request (`ops`): its async form, the in-place one
(`*_async_`), the in-place call that waits (`*_`) and each one's grouped twin (`grouped_*`).

The form is read from the public name, as Horovod spells it: `grouped_` takes a list and fuses
it into one request, a trailing `_` works in place, and without `_async` the call waits and
returns the result. The name must be one of the op's spec's faces (`OpSpec.faces`), so that
the spec stays the one list of an op's names. A form takes the request's own parameters after
the tensor (`inspect.signature` shows them, as Horovod's hand-written calls do) and passes
them on untouched, so a deprecation warning the request raises at `stacklevel=5` names the
caller's line whichever form was called.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec

import torch

from hora.collectives._control import state as _state
from hora.collectives._control.requests import Tensors
from hora.collectives._data.registry import faces

P = ParamSpec("P")


@dataclass(frozen=True)
class Form:
    """Which of Horovod's forms a call is: what its request submits."""

    #: a list in, one fused request, a list out
    grouped: bool
    #: the result lands in the tensors given
    inplace: bool

    @classmethod
    def named(cls, name: str, grouped: bool, waits: bool) -> Form:
        """The form `name` spells, which must be a face of an op's spec and a form that
        `grouped` and `waits` as its maker builds."""
        if name not in faces("collectives"):
            raise ValueError(f"{name!r} is no op's face in its spec (OpSpec.faces)")
        if (name.startswith("grouped_"), "_async" not in name) != (grouped, waits):
            raise ValueError(f"{name!r} is not a form with grouped={grouped}, waits={waits}")
        return cls(grouped=grouped, inplace=name.endswith("_"))


#: An op's request as its forms call it: the form, this rank's tensors, then the public
#: parameters; returns the handle.
Submit = Callable[Concatenate[Form, Tensors, P], int]


def handle_form(
    request: Submit[P], name: str, doc: str | None
) -> Callable[Concatenate[torch.Tensor, P], int]:
    """`<op>_async` or `<op>_async_`: submit one tensor, return the handle."""
    form = Form.named(name, grouped=False, waits=False)

    def call(tensor: torch.Tensor, *args: P.args, **kwargs: P.kwargs) -> int:
        return _submitted(call, request, form, [tensor], tensor, args, kwargs)

    return _named(call, request, name, doc, first=("tensor", "torch.Tensor"), returns="int")


def grouped_handle_form(
    request: Submit[P], name: str, doc: str | None
) -> Callable[Concatenate[Tensors, P], int]:
    """`grouped_<op>_async` or `grouped_<op>_async_`: submit a list as one request."""
    form = Form.named(name, grouped=True, waits=False)

    def call(tensors: Tensors, *args: P.args, **kwargs: P.kwargs) -> int:
        return _submitted(call, request, form, list(tensors), tensors, args, kwargs)

    return _named(call, request, name, doc, first=("tensors", "Tensors"), returns="int")


def in_place_form(
    request: Submit[P], name: str, doc: str | None
) -> Callable[Concatenate[torch.Tensor, P], torch.Tensor]:
    """`<op>_`: work on one tensor in place, wait, return it."""
    form = Form.named(name, grouped=False, waits=True)

    def call(tensor: torch.Tensor, *args: P.args, **kwargs: P.kwargs) -> torch.Tensor:
        handle = _submitted(call, request, form, [tensor], tensor, args, kwargs)
        return _synchronize(handle)

    return _named(
        call, request, name, doc, first=("tensor", "torch.Tensor"), returns="torch.Tensor"
    )


def grouped_in_place_form(
    request: Submit[P], name: str, doc: str | None
) -> Callable[Concatenate[Tensors, P], list[torch.Tensor]]:
    """`grouped_<op>_`: work on a list in place as one request, wait, return the list."""
    form = Form.named(name, grouped=True, waits=True)

    def call(tensors: Tensors, *args: P.args, **kwargs: P.kwargs) -> list[torch.Tensor]:
        handle = _submitted(call, request, form, list(tensors), tensors, args, kwargs)
        return _synchronize(handle)

    return _named(
        call, request, name, doc, first=("tensors", "Tensors"), returns="list[torch.Tensor]"
    )


def _submitted(
    public: Callable[..., Any],
    request: Callable[..., int],
    form: Form,
    tensors: Tensors,
    given: Any,
    args: tuple,
    kwargs: dict,
) -> int:
    """The request's handle. A call that does not bind to the `public` form's parameters is
    told under the name the user called (`allreduce_async(): got an unexpected keyword
    argument 'foo'`), not the shared request's; any other TypeError came from inside, as is."""
    try:
        return request(form, tensors, *args, **kwargs)
    except TypeError:
        try:
            inspect.signature(public).bind(given, *args, **kwargs)
        except TypeError as unbound:
            raise TypeError(f"{public.__name__}(): {unbound}") from None
        raise


def _synchronize(handle: int) -> Any:
    """`ops.synchronize` for the plain handles the forms return (ops imports this module)."""
    return _state.get().loop.synchronize(handle)


def _named(
    call: Callable[..., Any],
    request: Callable[..., Any],
    name: str,
    doc: str | None,
    first: tuple[str, str],
    returns: str,
) -> Any:
    """`call` as the public `name` of the module that declares `request`: its name, docstring
    and signature (the request's parameters after the tensor), as a hand-written one's."""
    tensor, annotation = first
    _, _, *rest = inspect.signature(request).parameters.values()
    head = inspect.Parameter(tensor, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotation)
    call.__signature__ = inspect.Signature([head, *rest], return_annotation=returns)  # type: ignore[attr-defined]
    call.__annotations__ = {p.name: p.annotation for p in (head, *rest)} | {"return": returns}
    call.__name__ = call.__qualname__ = name
    call.__doc__ = doc
    call.__module__ = request.__module__
    call.__wrapped__ = request  # type: ignore[attr-defined]
    return call
