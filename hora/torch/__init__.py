"""Horovod's PyTorch API on torch.distributed: `import hora.torch as hvd`.

Scripts written for `import horovod.torch as hvd` run unchanged: gloo moves CPU tensors, NCCL
CUDA tensors, and a background collective loop gives Horovod's name-matched, validated, fused
collectives.
"""

from typing import TYPE_CHECKING

from hora.collectives.framework import HostsUpdatedInterrupt as HostsUpdatedInterrupt
from hora.timeline import start_timeline as start_timeline
from hora.timeline import stop_timeline as stop_timeline
from hora.timeline import timeline_context as timeline_context
from hora.torch import elastic as elastic
from hora.torch import mpi_ops
from hora.torch.compression import Compression as Compression
from hora.torch.functions import allgather_object as allgather_object
from hora.torch.functions import broadcast_object as broadcast_object
from hora.torch.functions import broadcast_optimizer_state as broadcast_optimizer_state
from hora.torch.functions import broadcast_parameters as broadcast_parameters
from hora.torch.mpi_ops import *  # noqa: F403 - the whole collective surface, listed in its __all__
from hora.torch.optimizer import DistributedOptimizer as DistributedOptimizer
from hora.torch.sync_batch_norm import SyncBatchNorm as SyncBatchNorm

# The names this package adds to Horovod's collectives (`mpi_ops.__all__`, each op's from its
# spec).
# mypy reads no computed __all__ (it would export nothing); without one it sees every public name.
if not TYPE_CHECKING:
    __all__ = [
        "Compression",
        "DistributedOptimizer",
        "HostsUpdatedInterrupt",
        "SyncBatchNorm",
        "allgather_object",
        "broadcast_object",
        "broadcast_optimizer_state",
        "broadcast_parameters",
        "elastic",
        "start_timeline",
        "stop_timeline",
        "timeline_context",
        *mpi_ops.__all__,
    ]
