"""Horovod's collectives (`horovod.torch.mpi_ops`): sync, async, in-place and grouped forms.

The framework-neutral part (requests, async forms, synchronize, init and ranks) lives in
`hora.collectives`; this module adds the differentiable forms from `hora.torch._autograd`. It is a
package only so that the engine's history follows `hora/collectives/ops.py` (formerly this file).
"""

# ruff: noqa: F405 - the names of __all__ come from the star imports
from hora.collectives import *  # noqa: F403 - the neutral surface, listed in its __all__
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

# Listed name by name, not computed from the lists of the modules star-imported above, so that
# type checkers see the surface; tests/test_public_names.py checks that it is still their union.
__all__ = [
    "Adasum",
    "Average",
    "HorovodInternalError",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "sparse_allreduce_async",
    "synchronize",
]
