"""Horovod's Keras API for Keras 3 on the TensorFlow backend: `import hora.tensorflow.keras as hvd`.

`hvd.DistributedOptimizer(opt)` wraps any Keras 3 optimizer so that `model.fit` averages the
gradients over the ranks; the callbacks (`hvd.callbacks.*`) broadcast the initial state, average
metrics and warm the learning rate up as Horovod's do. Horovod itself fails on Keras 3
(horovod#4290); see hora/tensorflow/keras/_optimizer.py for how the gradients are reached.
"""

from __future__ import annotations

from typing import Any

import keras

from hora.collectives._basics import *  # noqa: F403 - init, ranks, process sets; its __all__
from hora.collectives._basics import __all__ as _basics_all
from hora.collectives.ops import Adasum as Adasum
from hora.collectives.ops import Average as Average
from hora.collectives.ops import HorovodInternalError as HorovodInternalError
from hora.collectives.ops import ProcessSet as ProcessSet
from hora.collectives.ops import Sum as Sum
from hora.collectives.ops import global_process_set as global_process_set
from hora.tensorflow import Compression as Compression
from hora.tensorflow import SyncBatchNormalization as SyncBatchNormalization
from hora.tensorflow import allgather as allgather
from hora.tensorflow import allgather_object as allgather_object
from hora.tensorflow import allreduce as allreduce
from hora.tensorflow import broadcast as broadcast
from hora.tensorflow import broadcast_object as broadcast_object
from hora.tensorflow import broadcast_variables as broadcast_variables
from hora.tensorflow import reducescatter as reducescatter
from hora.tensorflow.compression import Compressor
from hora.tensorflow.keras import callbacks as callbacks
from hora.tensorflow.keras._optimizer import DistributedOptimizer as DistributedOptimizer
from hora.tensorflow.keras._optimizer import (
    PartialDistributedOptimizer as PartialDistributedOptimizer,
)
from hora.tensorflow.keras._optimizer import default_options, make_distributed
from hora.timeline import start_timeline as start_timeline
from hora.timeline import stop_timeline as stop_timeline

__all__ = [
    *(n for n in _basics_all if n != "NOT_INITIALIZED"),
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "HorovodInternalError",
    "PartialDistributedOptimizer",
    "ProcessSet",
    "Sum",
    "SyncBatchNormalization",
    "allgather",
    "allgather_object",
    "allreduce",
    "broadcast",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_variables",
    "callbacks",
    "global_process_set",
    "load_model",
    "reducescatter",
    "start_timeline",
    "stop_timeline",
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
