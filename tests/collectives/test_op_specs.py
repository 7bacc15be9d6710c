"""One place per collective op: each op's facts are its `OpSpec`, and every table is read from
the specs, so the modules that hold the tables name no op."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import hora.collectives
from hora.collectives import ops
from hora.collectives._data.op_spec import FRAMEWORKS
from hora.collectives._data.registry import OPS, PER_RANK_KINDS, faces
from hora.collectives._forms import Form
from hora.collectives._messages import ALLGATHER, ALLREDUCE, ALLTOALL, BARRIER, BROADCAST, Request

COLLECTIVES = Path(hora.collectives.__file__).parent

#: the modules that derive a table from the specs (or show it to the frameworks): no op is
#: named in them, so a new op never touches them
TABLES = (
    "_control/planning.py",
    "_control/validation.py",
    "_control/cache.py",
    "_data/execute.py",
    "_data/registry.py",
    "_data/op_spec.py",
    "_forms.py",
    "framework.py",
    "__init__.py",
)

#: where a framework shows its ops' faces
FACE_MODULES = {
    "collectives": "hora.collectives",
    "torch": "hora.torch",
    "tensorflow": "hora.tensorflow",
    "keras": "hora.tensorflow.keras",
}


def test_every_op_has_a_spec() -> None:
    assert set(OPS) == {
        "allreduce",
        "allgather",
        "broadcast",
        "alltoall",
        "reducescatter",
        "barrier",
    }
    assert all(spec.kind == kind for kind, spec in OPS.items())


def test_horovods_facts_come_out_of_the_specs() -> None:
    assert {kind for kind, spec in OPS.items() if spec.fuses_on} == {
        ALLREDUCE,
        ALLGATHER,
        BROADCAST,
    }
    assert {ALLGATHER, ALLTOALL} == PER_RANK_KINDS
    assert {kind for kind, spec in OPS.items() if spec.join_refusal} == {
        ALLGATHER,
        BROADCAST,
        ALLTOALL,
    }
    assert OPS[BARRIER].faces == {"collectives": ("barrier",)}


def test_what_fusing_ops_agree_on() -> None:
    req = Request("x", ALLREDUCE, 0, ("float32",), ((4,),), "cpu", 16, 1, 0.5, 2.0, 3)
    assert OPS[ALLREDUCE].fuses_on(req) == (1, 0.5, 2.0)  # type: ignore[misc]
    assert OPS[BROADCAST].fuses_on(req._replace(kind=BROADCAST)) == (3,)  # type: ignore[misc]
    assert OPS[ALLGATHER].fuses_on(req._replace(kind=ALLGATHER)) == ()  # type: ignore[misc]


@pytest.mark.parametrize("path", TABLES)
def test_the_tables_name_no_op(path: str) -> None:
    text = (COLLECTIVES / path).read_text().lower()
    named = [kind for kind in OPS if re.search(rf"\b{kind}\b", text)]
    assert named == [], f"hora/collectives/{path} names {named}: read it from the specs"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_face_is_there(framework: str) -> None:
    module = pytest.importorskip(FACE_MODULES[framework])
    names = faces(framework)
    assert names, framework
    assert set(names) <= set(module.__all__)
    assert [name for name in names if not callable(getattr(module, name, None))] == []


def test_an_unknown_framework_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown framework"):
        faces("jax")


def test_horovods_import_path_of_mpi_ops() -> None:
    """`horovod.torch.mpi_ops` is a module users import: so is `hora.torch.mpi_ops`."""
    mpi_ops = importlib.import_module("hora.torch.mpi_ops")
    assert Path(mpi_ops.__file__).name == "mpi_ops.py"
    assert callable(mpi_ops.reducescatter) and callable(mpi_ops.allreduce_async)


def test_each_form_is_named_by_its_spec_and_shows_its_request_s_parameters() -> None:
    """The forms `_forms` makes read as hand-written ones: name, signature, module."""
    made = ops.grouped_allreduce_async_
    assert (made.__name__, made.__qualname__, made.__module__) == (
        "grouped_allreduce_async_",
        "grouped_allreduce_async_",
        "hora.collectives.ops",
    )
    assert list(inspect.signature(made).parameters) == [
        "tensors",
        "average",
        "name",
        "op",
        "prescale_factor",
        "postscale_factor",
        "process_set",
    ]
    signature = inspect.signature(ops.broadcast_)
    assert [(p.name, p.annotation) for p in signature.parameters.values()][:3] == [
        ("tensor", "torch.Tensor"),
        ("root_rank", "int"),
        ("name", "str | None"),
    ]
    assert signature.return_annotation == "torch.Tensor"
    assert Form.named("allreduce_async_", grouped=False, waits=False) == Form(False, True)


@pytest.mark.parametrize(
    "name, grouped, waits",
    [("allreduce", False, False), ("allreduce_async", True, False), ("broadcast_", False, False)],
)
def test_a_form_its_spec_does_not_name_is_refused(name: str, grouped: bool, waits: bool) -> None:
    with pytest.raises(ValueError, match=repr(name)):
        Form.named(name, grouped=grouped, waits=waits)


@pytest.mark.parametrize(
    "name, call",
    [
        ("allreduce_async", lambda f: f(torch.zeros(2), foo=1)),
        ("grouped_allreduce_", lambda f: f([torch.zeros(2)], foo=1)),
        ("broadcast_async_", lambda f: f(torch.zeros(2), 0, "name", None, "one too many")),
    ],
)
def test_a_form_called_wrongly_says_so_under_its_own_name(name: str, call: Any) -> None:
    """Not under the request the forms share: the user called `name`."""
    said = "(got an unexpected keyword argument 'foo'|too many positional arguments)"
    with pytest.raises(TypeError, match=rf"^{name}\(\): {said}$"):
        call(getattr(ops, name))
