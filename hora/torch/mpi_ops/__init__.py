"""Horovod's collectives (`horovod.torch.mpi_ops`): sync, async, in-place and grouped forms.

The framework-neutral part (requests, async forms, synchronize, init and ranks) lives in
`hora.collectives`; this module adds the differentiable forms from `hora.torch._autograd`. It is a
package only so that the engine's history follows `hora/collectives/ops.py` (formerly this file).
"""

from hora.collectives import *  # noqa: F403 - the neutral surface, listed in its __all__
from hora.collectives import __all__ as _neutral_all
from hora.collectives.framework import SparseHandle as SparseHandle
from hora.torch._autograd import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)

__all__ = [
    *(n for n in _neutral_all if n != "NOT_INITIALIZED"),
    "allgather",
    "allreduce",
    "alltoall",
    "broadcast",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "reducescatter",
]
