"""Horovod's PyTorch API on torch.distributed: `import hora.torch as hvd`.

Scripts written for `import horovod.torch as hvd` run unchanged: gloo moves CPU tensors, NCCL
CUDA tensors, and a background engine gives Horovod's name-matched, validated, fused collectives.
"""

# ruff: noqa: F405 - the names of __all__ come from the star imports
from hora.collectives.framework import HostsUpdatedInterrupt as HostsUpdatedInterrupt
from hora.timeline import start_timeline as start_timeline
from hora.timeline import stop_timeline as stop_timeline
from hora.timeline import timeline_context as timeline_context
from hora.torch import elastic as elastic
from hora.torch.compression import Compression as Compression
from hora.torch.functions import allgather_object as allgather_object
from hora.torch.functions import broadcast_object as broadcast_object
from hora.torch.functions import broadcast_optimizer_state as broadcast_optimizer_state
from hora.torch.functions import broadcast_parameters as broadcast_parameters
from hora.torch.mpi_ops import *  # noqa: F403 - the whole collective surface, listed in __all__
from hora.torch.optimizer import DistributedOptimizer as DistributedOptimizer
from hora.torch.sync_batch_norm import SyncBatchNorm as SyncBatchNorm

# Listed name by name, not computed from the lists of the modules star-imported above, so that
# type checkers see the surface; tests/test_public_names.py checks that it is still their union.
__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "SyncBatchNorm",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allgather_object",
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
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "elastic",
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
    "start_timeline",
    "stop_timeline",
    "synchronize",
    "timeline_context",
]
