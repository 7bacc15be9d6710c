"""What a framework API (hora.torch, hora.tensorflow) builds on, beyond Horovod's own calls.

Horovod's calls are `hora.collectives` (its `__all__`), which a framework re-exports. To add its
gradients and tensor types, a framework also needs the op resolution that keeps Horovod's
`average=` deprecation (`resolve_op`), the errors it maps to its own, a registered process set by
its id, and which public names each op has in it (`op_faces`: its `__all__` is derived from
them). Each op's request with every argument explicit (`submit_*`) and its kind are the op's
face in `ops`.
"""

from __future__ import annotations

import warnings

from hora.collectives._common import (
    OP_NAMES,
    Adasum,
    Average,
    CollectiveRefusedError,
    HostsUpdatedInterrupt,
    Sum,
)
from hora.collectives._control import state as _state
from hora.collectives._control.process_sets import ProcessSet
from hora.collectives._control.requests import Tensors
from hora.collectives._control.sparse import SparseHandle
from hora.collectives._data.registry import faces

__all__ = [
    "CollectiveRefusedError",
    "HostsUpdatedInterrupt",
    "SparseHandle",
    "Tensors",
    "op_faces",
    "process_set_by_id",
    "resolve_op",
]


def op_faces(framework: str) -> list[str]:
    """The public names the ops have in `framework` ("collectives", "torch", "tensorflow",
    "keras"), as their specs declare them: each framework's `__all__` is built from them, so a
    new op reaches every list by its own spec."""
    return faces(framework)


def resolve_op(average: bool | None, op: int | None, stacklevel: int = 3) -> int:
    """The reduction op a call's `average=` or `op=` asks for (Average when neither does).
    `stacklevel`: where the `average` deprecation points, the user's call by default."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average; please provide only one of them.")
    if average is not None:
        warnings.warn(
            "Parameter `average` has been replaced with `op` and will be removed",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
        op = Average if average else Sum
    if op is None:
        op = Average
    if op == Adasum:
        raise NotImplementedError(
            "Adasum is not implemented in hora.torch; use op=hvd.Average or op=hvd.Sum"
        )
    if op not in OP_NAMES:
        raise ValueError(f"Unknown reduction op {op!r}")
    return op


def process_set_by_id(process_set_id: int) -> ProcessSet | None:
    """The registered process set `process_set_id`, None if there is none (ValueError before
    `init()`)."""
    return _state.get().process_sets.get(int(process_set_id))
