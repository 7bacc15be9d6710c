"""Horovod's TensorFlow 2 API on hora's collective loop: `import hora.tensorflow as hvd`.

Scripts written for `import horovod.tensorflow as hvd` run unchanged, eagerly and inside
`tf.function`, with nothing to compile: the collectives run on the collective loop hora.torch
uses (name-matched, validated, fused; gloo and shared memory), fed TF data without a copy, with
Horovod's TF gradients and error classes (tf.errors.FailedPreconditionError when the ranks
disagree, InvalidArgumentError for a bad argument an op checks).
"""

from typing import TYPE_CHECKING

import tensorflow as tf

from hora.collectives import Adasum as Adasum
from hora.collectives import Average as Average
from hora.collectives import HorovodInternalError as HorovodInternalError
from hora.collectives import Max as Max
from hora.collectives import Min as Min
from hora.collectives import ProcessSet as ProcessSet
from hora.collectives import Product as Product
from hora.collectives import Sum as Sum
from hora.collectives import add_process_set as add_process_set
from hora.collectives import barrier as barrier
from hora.collectives import ccl_built as ccl_built
from hora.collectives import cross_rank as cross_rank
from hora.collectives import cross_size as cross_size
from hora.collectives import cuda_built as cuda_built
from hora.collectives import ddl_built as ddl_built
from hora.collectives import global_process_set as global_process_set
from hora.collectives import gloo_built as gloo_built
from hora.collectives import gloo_enabled as gloo_enabled
from hora.collectives import init as init
from hora.collectives import is_homogeneous as is_homogeneous
from hora.collectives import is_initialized as is_initialized
from hora.collectives import local_rank as local_rank
from hora.collectives import local_size as local_size
from hora.collectives import mpi_built as mpi_built
from hora.collectives import mpi_enabled as mpi_enabled
from hora.collectives import mpi_threads_supported as mpi_threads_supported
from hora.collectives import nccl_built as nccl_built
from hora.collectives import rank as rank
from hora.collectives import remove_process_set as remove_process_set
from hora.collectives import rocm_built as rocm_built
from hora.collectives import shutdown as shutdown
from hora.collectives import size as size
from hora.tensorflow.compression import Compression as Compression
from hora.tensorflow.functions import allgather_object as allgather_object
from hora.tensorflow.functions import broadcast_ as broadcast_
from hora.tensorflow.functions import (
    broadcast_global_variables as broadcast_global_variables,
)
from hora.tensorflow.functions import broadcast_object as broadcast_object
from hora.tensorflow.functions import broadcast_variables as broadcast_variables
from hora.tensorflow.gradient_tape import DistributedGradientTape as DistributedGradientTape
from hora.tensorflow.gradient_tape import (
    PartialDistributedGradientTape as PartialDistributedGradientTape,
)
from hora.tensorflow.mpi_ops import *  # noqa: F403 - each op's TF face and the TF-only ops
from hora.tensorflow.sync_batch_norm import SyncBatchNormalization as SyncBatchNormalization
from hora.timeline import start_timeline as start_timeline
from hora.timeline import stop_timeline as stop_timeline

from hora.tensorflow import elastic as elastic  # isort: skip -- uses the names above
from hora.tensorflow import mpi_ops  # isort: skip -- imported above, named for __all__


def _executing_eagerly() -> bool:
    """Whether TensorFlow runs eagerly here: Horovod's private helper, which Horovod's own tests
    and some user code call as `hvd._executing_eagerly()`."""
    return bool(tf.executing_eagerly())


# The names this package adds, and each op's TF face with the TF-only ops (`mpi_ops.__all__`).
# mypy reads no computed __all__ (it would export nothing); without one it sees every public name.
if not TYPE_CHECKING:
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
        "allgather_object",
        "barrier",
        "broadcast_",
        "broadcast_global_variables",
        "broadcast_object",
        "broadcast_variables",
        "ccl_built",
        "cross_rank",
        "cross_size",
        "cuda_built",
        "ddl_built",
        "elastic",
        "global_process_set",
        "gloo_built",
        "gloo_enabled",
        "init",
        "is_homogeneous",
        "is_initialized",
        "local_rank",
        "local_size",
        "mpi_built",
        "mpi_enabled",
        "mpi_threads_supported",
        "nccl_built",
        "rank",
        "remove_process_set",
        "rocm_built",
        "shutdown",
        "size",
        "start_timeline",
        "stop_timeline",
        *mpi_ops.__all__,
    ]
