"""Horovod's Keras API for Keras 3 on the TensorFlow backend: `import hora.tensorflow.keras as hvd`.

`hvd.DistributedOptimizer(opt)` wraps any Keras 3 optimizer so that `model.fit` averages the
gradients over the ranks; the callbacks (`hvd.callbacks.*`) broadcast the initial state, average
metrics and warm the learning rate up as Horovod's do. Horovod itself fails on Keras 3
(horovod#4290); see hora/tensorflow/keras/_optimizer.py for how the gradients are reached.
"""

from __future__ import annotations

from typing import Any

import keras

from hora.collectives import Adasum as Adasum
from hora.collectives import Average as Average
from hora.collectives import HorovodInternalError as HorovodInternalError
from hora.collectives import ProcessSet as ProcessSet
from hora.collectives import Sum as Sum
from hora.collectives import add_process_set as add_process_set
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
from hora.collectives.framework import op_faces
from hora.tensorflow import Compression as Compression
from hora.tensorflow import SyncBatchNormalization as SyncBatchNormalization
from hora.tensorflow import allgather_object as allgather_object
from hora.tensorflow import broadcast_object as broadcast_object
from hora.tensorflow import broadcast_variables as broadcast_variables
from hora.tensorflow import mpi_ops as _tf_ops
from hora.tensorflow.compression import Compressor
from hora.tensorflow.keras import callbacks as callbacks
from hora.tensorflow.keras._optimizer import DistributedOptimizer as DistributedOptimizer
from hora.tensorflow.keras._optimizer import (
    PartialDistributedOptimizer as PartialDistributedOptimizer,
)
from hora.tensorflow.keras._optimizer import default_options, make_distributed
from hora.timeline import start_timeline as start_timeline
from hora.timeline import stop_timeline as stop_timeline

from hora.tensorflow.keras import elastic as elastic  # isort: skip -- uses the names above

# Each op's Keras face is its TF face, for the ops whose spec names one: taken by name so that a
# new op reaches Keras through its spec alone.
_OP_FACES = op_faces("keras")
globals().update({name: getattr(_tf_ops, name) for name in _OP_FACES})

# The names this package adds, and each op's Keras face.
__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "HorovodInternalError",
    "PartialDistributedOptimizer",
    "ProcessSet",
    "Sum",
    "SyncBatchNormalization",
    "add_process_set",
    "allgather_object",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_variables",
    "callbacks",
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
    "load_model",
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
    *_OP_FACES,
]


def broadcast_global_variables(root_rank: int, model: Any = None) -> None:
    """Make `model`'s variables and its optimizer's `root_rank`'s.

    Keras 3 has no global variable collection (TF1's, which Horovod's version read through a
    session), so the model is named: pass it, or use
    `callbacks.BroadcastGlobalVariablesCallback(root_rank)` in `model.fit`.
    """
    if model is None:
        raise ValueError(
            "Keras 3 has no global variables: call broadcast_global_variables(root_rank, model) "
            "or add hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank) to model.fit"
        )
    broadcast_variables(model.variables, root_rank)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and optimizer.variables:
        broadcast_variables(optimizer.variables, root_rank)


def load_model(
    filepath: str,
    custom_optimizers: list[type] | None = None,
    custom_objects: dict[str, Any] | None = None,
    compression: type[Compressor] = Compression.none,
    legacy_opts: bool = False,
) -> keras.Model:
    """`keras.models.load_model` whose compiled optimizer (its state kept) reduces gradients
    over the ranks, as if wrapped in DistributedOptimizer."""
    if legacy_opts:
        raise ValueError("Keras 3 has no legacy optimizers (keras.optimizers.legacy)")
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or []:
        objects[cls.__name__] = cls
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    optimizer = getattr(model, "optimizer", None)
    if isinstance(optimizer, keras.optimizers.Optimizer):
        options = default_options()
        options["compression"] = compression
        make_distributed(optimizer, options)
    return model
