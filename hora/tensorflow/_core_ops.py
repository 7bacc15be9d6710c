"""The differentiable allreduce and allgather that every TF op and its gradient is made of, and
how an op is named for the loop (`hora.tensorflow.mpi_ops` is the face)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import torch

from hora.collectives import Average, ProcessSet, rank, synchronize
from hora.collectives.ops import ALLGATHER, ALLREDUCE, submit_allgather, submit_allreduce
from hora.tensorflow import _bridge

NO_ADASUM = "Adasum is not implemented in hora.tensorflow; use op=hvd.Average or op=hvd.Sum"


def op_name(name: str | None, kind: str, ignore_name_scope: bool) -> str | None:
    """The loop's key for this op: the caller's name (under its name scope unless
    `ignore_name_scope`), else a trace-time name inside a graph, else the loop's eager count."""
    if name is None:
        return None if tf.executing_eagerly() else _bridge.graph_name(kind)
    scope = "" if ignore_name_scope else tf.get_current_name_scope()
    return f"{scope}/{name}" if scope else name


def traced_name(name: str | None, kind: str) -> str | None:
    """Inside a graph every op gets a trace-time name (also a gradient's): the same every step,
    so the loop's response cache knows it."""
    if name is None and not tf.executing_eagerly():
        return _bridge.graph_name(kind)
    return name


def rest_shape(shape: tf.TensorShape) -> tf.TensorShape:
    """The shape of a result whose dim 0 depends on the other ranks."""
    return tf.TensorShape([None]).concatenate(shape[1:]) if shape.rank else shape


# ----- allreduce -------------------------------------------------------------------------------
def allreduce_raw(
    tensors: list[tf.Tensor],
    name: str | None,
    op: int,
    prescale: float,
    postscale: float,
    process_set: ProcessSet,
) -> list[tf.Tensor]:
    name = traced_name(name, ALLREDUCE)

    def call(ts: list[torch.Tensor]) -> list[torch.Tensor]:
        handle = submit_allreduce(ts, name, op, prescale, postscale, process_set, False, True)
        return synchronize(handle)

    return _bridge.run(
        call, tensors, [t.dtype for t in tensors], [t.shape for t in tensors], "HorovodAllreduce"
    )


def allreduce_diff(
    tensors: list[tf.Tensor],
    name: str | None,
    op: int,
    prescale: float,
    postscale: float,
    process_set: ProcessSet,
) -> list[tf.Tensor]:
    @tf.custom_gradient
    def forward(*xs: tf.Tensor) -> Any:
        ys = allreduce_raw(list(xs), name, op, prescale, postscale, process_set)

        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            grad_name = None if name is None else f"{name}.grad"
            return allreduce_diff(list(dys), grad_name, op, prescale, postscale, process_set)

        return ys, grad

    out = forward(*tensors)
    return list(out) if isinstance(out, list | tuple) else [out]


# ----- allgather -------------------------------------------------------------------------------
def allgather_raw(
    tensors: list[tf.Tensor], name: str | None, process_set: ProcessSet
) -> list[tf.Tensor]:
    for t in tensors:
        if t.shape.rank == 0:
            raise ValueError("allgather needs tensors of at least one dimension")
    name = traced_name(name, ALLGATHER)

    def call(ts: list[torch.Tensor]) -> list[torch.Tensor]:
        return synchronize(submit_allgather(ts, name, process_set, True))

    return _bridge.run(
        call,
        tensors,
        [t.dtype for t in tensors],
        [rest_shape(t.shape) for t in tensors],
        "HorovodAllgather",
    )


def my_rows(grad: tf.Tensor, x: tf.Tensor, process_set: ProcessSet) -> tf.Tensor:
    """This rank's rows of an allgather's gradient (rows per rank are gathered first)."""
    counts = allgather_raw([tf.reshape(tf.shape(x, out_type=tf.int64)[0], [1])], None, process_set)[
        0
    ]
    index = process_set.ranks.index(rank())
    start = tf.reduce_sum(counts[:index])
    return grad[start : start + counts[index]]


def allgather_diff(
    tensors: list[tf.Tensor], name: str | None, process_set: ProcessSet
) -> list[tf.Tensor]:
    @tf.custom_gradient
    def forward(*xs: tf.Tensor) -> Any:
        ys = allgather_raw(list(xs), name, process_set)

        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            averaged = allreduce_diff(list(dys), None, Average, 1.0, 1.0, process_set)
            return [my_rows(g, x, process_set) for g, x in zip(averaged, xs, strict=True)]

        return ys, grad

    out = forward(*tensors)
    return list(out) if isinstance(out, list | tuple) else [out]
