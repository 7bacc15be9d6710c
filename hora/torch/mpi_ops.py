"""Horovod's collectives (`horovod.torch.mpi_ops`): sync, async, in-place and grouped forms.

The framework-neutral part (requests, async forms, synchronize, init and ranks) lives in
`hora.collectives`; this module adds the differentiable forms from `hora.torch._autograd`. Each
op's names come from its spec (`hora.collectives.framework.op_faces`).
"""

from typing import TYPE_CHECKING

import hora.collectives
from hora.collectives import *  # noqa: F403 - the neutral surface, listed in its __all__
from hora.collectives.framework import SparseHandle as SparseHandle
from hora.collectives.framework import op_faces
from hora.torch._autograd import *  # noqa: F403 - the differentiable forms, listed in its __all__

# mypy reads no computed __all__ (it would export nothing); without one it sees every public name.
if not TYPE_CHECKING:
    __all__ = sorted(
        {*hora.collectives.__all__, *op_faces("torch")} - {"NOT_INITIALIZED"},
    )
