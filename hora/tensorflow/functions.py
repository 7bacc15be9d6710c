"""Variables and Python objects across ranks: `broadcast_variables`, the in-place `broadcast_`,
TF1's `broadcast_global_variables`, `broadcast_object`, `allgather_object` (the object ones are
the loop's, shared with hora.torch)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tensorflow as tf
import torch

from hora.collectives import ProcessSet, global_process_set, synchronize
from hora.collectives.objects import allgather_object as _allgather_object
from hora.collectives.objects import broadcast_object as _broadcast_object
from hora.collectives.ops import submit_broadcast
from hora.tensorflow import _bridge

__all__ = [
    "allgather_object",
    "broadcast_",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_variables",
]


def broadcast_variables(
    variables: Iterable[Any], root_rank: int, process_set: ProcessSet = global_process_set
) -> Any:
    """Assign `root_rank`'s values to `variables` (tf.Variable or keras.Variable), in order:
    every rank passes its variables in the same order, as Horovod requires. Eagerly it is done
    on return; in a TF1 graph it returns the op that does it (run it in the Session), as
    Horovod's does."""
    variables = list(variables)
    assigned = (
        _assign_broadcast(variables, int(root_rank), "broadcast_variables", process_set)
        if variables
        else []
    )
    return None if tf.executing_eagerly() else tf.group(*assigned)


def broadcast_global_variables(root_rank: int) -> Any:
    """TF1's: the op that assigns `root_rank`'s values to every global variable of the graph.
    Eager code has no global variables: a RuntimeError, as Horovod raises."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() does not support eager execution. "
            "Please use `hvd.broadcast_variables(<model/optimizer variables>)` instead."
        )
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def broadcast_(
    variables: Any,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Horovod's in-place broadcast: `root_rank`'s values assigned to `variables` (one variable
    or a list), whose new values are returned (a tensor or a list, as given). In a TF1 graph
    the values are read after the assignment, so running them in a Session broadcasts."""
    single = not isinstance(variables, list | tuple)
    variables = [variables] if single else list(variables)
    if not variables:
        return []
    assigned = _assign_broadcast(variables, int(root_rank), name, process_set)
    after = [] if tf.executing_eagerly() else [tf.group(*assigned)]
    with tf.control_dependencies(after):
        values = [_tf_value(v).read_value() for v in variables]
    return values[0] if single else values


def _assign_broadcast(
    variables: list[Any], root_rank: int, name: str | None, process_set: ProcessSet
) -> list[Any]:
    """The variables' assignments (ops in a graph: built, not run)."""
    values = [tf.convert_to_tensor(_tf_value(v)) for v in variables]
    received = _broadcast_group(values, root_rank, name, process_set)
    return [var.assign(value) for var, value in zip(variables, received, strict=True)]


def _tf_value(var: Any) -> Any:
    """A Keras 3 variable's tf value (`keras.Variable.value`), or the variable itself."""
    value = getattr(var, "value", None)
    return value if isinstance(value, tf.Variable | tf.Tensor) else var


def _broadcast_group(
    values: list[tf.Tensor], root_rank: int, name: str | None, process_set: ProcessSet
) -> list[tf.Tensor]:
    """One op for the lot: every broadcast is started before any is awaited (the loop fuses
    them); each is awaited, so a failed one leaves none behind."""
    if name is None and not tf.executing_eagerly():
        name = _bridge.graph_name("broadcast_")
    names = [None if name is None else f"{name}.{i}" for i in range(len(values))]

    def call(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        handles = [
            submit_broadcast(t, root_rank, n, process_set, False)
            for t, n in zip(tensors, names, strict=True)
        ]
        results, error = [], None
        for handle in handles:
            try:
                results.append(synchronize(handle))
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error
        return results

    return _bridge.run(
        call, values, [v.dtype for v in values], [v.shape for v in values], "HorovodBroadcast"
    )


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
