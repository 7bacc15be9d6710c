"""Horovod's TensorFlow 2 API on hora's engine: `import hora.tensorflow as hvd`.

Scripts written for `import horovod.tensorflow as hvd` run unchanged, eagerly and inside
`tf.function`, with nothing to compile: the collectives are the same engine hora.torch uses
(name-matched, validated, fused; gloo and shared memory), fed TF data without a copy, with
Horovod's TF gradients and error classes (tf.errors.FailedPreconditionError when the ranks
disagree, InvalidArgumentError for a bad argument an op checks).
"""

# ruff: noqa: F405 - the names of __all__ come from the star imports
from hora.collectives._basics import *  # noqa: F403 - init, ranks, process sets; its __all__
from hora.collectives.ops import Adasum as Adasum
from hora.collectives.ops import Average as Average
from hora.collectives.ops import HorovodInternalError as HorovodInternalError
from hora.collectives.ops import Max as Max
from hora.collectives.ops import Min as Min
from hora.collectives.ops import ProcessSet as ProcessSet
from hora.collectives.ops import Product as Product
from hora.collectives.ops import Sum as Sum
from hora.collectives.ops import barrier as barrier
from hora.collectives.ops import global_process_set as global_process_set
from hora.tensorflow.compression import Compression as Compression
from hora.tensorflow.functions import allgather_object as allgather_object
from hora.tensorflow.functions import broadcast_ as broadcast_
from hora.tensorflow.functions import broadcast_object as broadcast_object
from hora.tensorflow.functions import broadcast_variables as broadcast_variables
from hora.tensorflow.gradient_tape import DistributedGradientTape as DistributedGradientTape
from hora.tensorflow.gradient_tape import (
    PartialDistributedGradientTape as PartialDistributedGradientTape,
)
from hora.tensorflow.mpi_ops import allgather as allgather
from hora.tensorflow.mpi_ops import allreduce as allreduce
from hora.tensorflow.mpi_ops import alltoall as alltoall
from hora.tensorflow.mpi_ops import broadcast as broadcast
from hora.tensorflow.mpi_ops import grouped_allgather as grouped_allgather
from hora.tensorflow.mpi_ops import grouped_allreduce as grouped_allreduce
from hora.tensorflow.mpi_ops import grouped_reducescatter as grouped_reducescatter
from hora.tensorflow.mpi_ops import join as join
from hora.tensorflow.mpi_ops import local_rank_op as local_rank_op
from hora.tensorflow.mpi_ops import local_size_op as local_size_op
from hora.tensorflow.mpi_ops import process_set_included_op as process_set_included_op
from hora.tensorflow.mpi_ops import rank_op as rank_op
from hora.tensorflow.mpi_ops import reducescatter as reducescatter
from hora.tensorflow.mpi_ops import size_op as size_op
from hora.tensorflow.sync_batch_norm import SyncBatchNormalization as SyncBatchNormalization
from hora.timeline import start_timeline as start_timeline
from hora.timeline import stop_timeline as stop_timeline

# Listed name by name, not computed from the lists of the modules star-imported above, so that
# type checkers see the surface; tests/test_public_names.py checks that it is still their union.
__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedGradientTape",
    "HorovodInternalError",
    "Max",
    "Min",
    "PartialDistributedGradientTape",
    "ProcessSet",
    "Product",
    "Sum",
    "SyncBatchNormalization",
    "add_process_set",
    "allgather",
    "allgather_object",
    "allreduce",
    "alltoall",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_object",
    "broadcast_variables",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_rank_op",
    "local_size",
    "local_size_op",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "process_set_included_op",
    "rank",
    "rank_op",
    "reducescatter",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "size_op",
    "start_timeline",
    "stop_timeline",
]
