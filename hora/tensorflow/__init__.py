"""Horovod's TensorFlow 2 API on hora's engine: `import hora.tensorflow as hvd`.

Scripts written for `import horovod.tensorflow as hvd` run unchanged, eagerly and inside
`tf.function`, with nothing to compile: the collectives are the same engine hora.torch uses
(name-matched, validated, fused; gloo and shared memory), fed TF data without a copy, with
Horovod's TF gradients and error classes (tf.errors.FailedPreconditionError when the ranks
disagree, InvalidArgumentError for a bad argument an op checks).
"""

from hora.collectives._basics import *  # noqa: F403 - init, ranks, process sets; its __all__
from hora.collectives._basics import __all__ as _basics_all
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

__all__ = [
    *(n for n in _basics_all if n != "NOT_INITIALIZED"),
    "Adasum",
    "Average",
    "HorovodInternalError",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "barrier",
    "global_process_set",
    "join",
    "Compression",
    "DistributedGradientTape",
    "PartialDistributedGradientTape",
    "SyncBatchNormalization",
    "allgather",
    "allgather_object",
    "allreduce",
    "alltoall",
    "broadcast",
    "broadcast_",
    "broadcast_object",
    "broadcast_variables",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "local_rank_op",
    "local_size_op",
    "process_set_included_op",
    "rank_op",
    "reducescatter",
    "size_op",
    "start_timeline",
    "stop_timeline",
]
