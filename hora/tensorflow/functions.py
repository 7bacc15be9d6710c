"""Variables and Python objects across ranks: `broadcast_variables`, `broadcast_object`,
`allgather_object` (the object ones are the engine's, shared with hora.torch)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from hora.collectives import ops as _ops
from hora.collectives._process_sets import ProcessSet, global_process_set
from hora.tensorflow import _bridge, mpi_ops
from hora.torch.functions import allgather_object as _allgather_object
from hora.torch.functions import broadcast_object as _broadcast_object

__all__ = ["allgather_object", "broadcast_object", "broadcast_variables"]


def broadcast_variables(
    variables: Iterable[Any], root_rank: int, process_set: ProcessSet = global_process_set
) -> None:
    """Assign `root_rank`'s values to `variables` (tf.Variable or keras.Variable), in order:
    every rank passes its variables in the same order, as Horovod requires."""
    variables = list(variables)
    if not variables:
        return
    values = [tf.convert_to_tensor(_tf_value(v)) for v in variables]
    received = _broadcast_group(values, int(root_rank), process_set)
    for var, value in zip(variables, received, strict=True):
        var.assign(value)


def _tf_value(var: Any) -> Any:
    """A Keras 3 variable's tf value (`keras.Variable.value`), or the variable itself."""
    value = getattr(var, "value", None)
    return value if isinstance(value, tf.Variable | tf.Tensor) else var


def _broadcast_group(
    values: list[tf.Tensor], root_rank: int, process_set: ProcessSet
) -> list[tf.Tensor]:
    """Eagerly every broadcast is started before any is awaited (the engine fuses them);
    inside a graph they are chained ops."""
    if not tf.executing_eagerly():
        return [
            mpi_ops.broadcast(
                v, root_rank, name=f"broadcast_variables.{i}", process_set=process_set
            )
            for i, v in enumerate(values)
        ]
    handles = [
        _ops._broadcast_async(
            _bridge.to_torch(v.numpy()), root_rank, f"broadcast_variables.{i}", process_set, False
        )
        for i, v in enumerate(values)
    ]
    return [tf.convert_to_tensor(_bridge.to_numpy(_ops.synchronize(h))) for h in handles]


def broadcast_object(
    obj: Any,
    root_rank: int = 0,
    session: Any = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """`root_rank`'s picklable object on every rank (`session` is TF1's and ignored)."""
    del session
    return _broadcast_object(obj, root_rank, name=name, process_set=process_set)


def allgather_object(
    obj: Any,
    session: Any = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> list[Any]:
    """Every rank's picklable object, in rank order (`session` is TF1's and ignored)."""
    del session
    return _allgather_object(obj, name=name, process_set=process_set)
