"""The TF ops that hand each rank its own block of rows: alltoall and reducescatter (re-exported
by `hora.tensorflow.mpi_ops`, the face), with Horovod's gradients."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf
import torch

from hora.collectives import Adasum, Average, ProcessSet, Sum, global_process_set, synchronize
from hora.collectives.ops import (
    ALLTOALL,
    REDUCESCATTER,
    submit_alltoall,
    submit_reducescatter,
)
from hora.tensorflow import _bridge
from hora.tensorflow._core_ops import NO_ADASUM, allgather_diff, op_name, rest_shape, traced_name
from hora.tensorflow.compression import Compression, Compressor

__all__ = ["alltoall", "grouped_reducescatter", "reducescatter"]


# ----- alltoall --------------------------------------------------------------------------------
def alltoall(
    tensor: Any,
    splits: Any = None,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Rows `splits[i]` go to rank i of the set (an even split when None); returns the
    gathered rows, plus the received splits when `splits` is given; differentiable."""
    tensor = tf.convert_to_tensor(tensor)
    if tensor.shape.rank == 0:
        raise ValueError("alltoall needs a tensor of at least one dimension")
    key = op_name(name, ALLTOALL, ignore_name_scope)
    n = process_set.size()  # the received splits' static shape: None while not registered
    split_tensor = None if splits is None else tf.convert_to_tensor(splits, dtype=tf.int32)

    @tf.custom_gradient
    def forward(x: tf.Tensor) -> Any:
        output, received = _alltoall_raw(x, split_tensor, key, process_set, n)

        def grad(dy: tf.Tensor, _: Any = None) -> tf.Tensor:
            back, _sent = _alltoall_raw(dy, received, None, process_set, n)
            unsent = tf.shape(x)[0] - tf.shape(back)[0]  # rows not sent get no gradient
            return tf.concat(
                [back, tf.zeros(tf.concat([[unsent], tf.shape(back)[1:]], 0), back.dtype)], 0
            )

        return (output, received), grad

    output, received = forward(tensor)
    return output if splits is None else (output, received)


def _alltoall_raw(
    tensor: tf.Tensor,
    splits: tf.Tensor | None,
    name: str | None,
    process_set: ProcessSet,
    n: int | None,
) -> tuple[tf.Tensor, tf.Tensor]:
    name = traced_name(name, ALLTOALL)

    def call(ts: list[torch.Tensor]) -> list[torch.Tensor]:
        given = ts[1] if len(ts) > 1 else None
        out, received = synchronize(submit_alltoall(ts[0], given, name, process_set, True))
        return [out, torch.as_tensor(received, dtype=torch.int32)]

    inputs = [tensor] if splits is None else [tensor, splits]
    out, received = _bridge.run(
        call,
        inputs,
        [tensor.dtype, tf.int32],
        [rest_shape(tensor.shape), tf.TensorShape([n])],
        "HorovodAlltoall",
    )
    return out, received


# ----- reducescatter ---------------------------------------------------------------------------
def _reducescatter_diff(
    tensors: list[tf.Tensor],
    name: str | None,
    op: int,
    prescale: float,
    postscale: float,
    process_set: ProcessSet,
) -> list[tf.Tensor]:
    if op == Adasum:
        raise NotImplementedError(NO_ADASUM)
    if op not in (Average, Sum):
        raise ValueError("reducescatter supports only op=Average and op=Sum")
    for t in tensors:
        if t.shape.rank == 0:
            raise ValueError("reducescatter needs tensors of at least one dimension")
    name = traced_name(name, REDUCESCATTER)

    def call(ts: list[torch.Tensor]) -> list[torch.Tensor]:
        return synchronize(
            submit_reducescatter(ts, name, op, prescale, postscale, process_set, True)
        )

    @tf.custom_gradient
    def forward(*xs: tf.Tensor) -> Any:
        ys = _bridge.run(
            call,
            list(xs),
            [t.dtype for t in xs],
            [rest_shape(t.shape) for t in xs],
            "HorovodReducescatter",
        )

        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            gathered = allgather_diff(list(dys), None, process_set)
            scale = prescale * postscale * (len(process_set.ranks) if op == Sum else 1)
            return [g if scale == 1 else g * tf.cast(scale, g.dtype) for g in gathered]

        return ys, grad

    out = forward(*tensors)
    return list(out) if isinstance(out, list | tuple) else [out]


def reducescatter(
    tensor: Any,
    device_dense: str = "",
    compression: type[Compressor] = Compression.none,
    op: int = Average,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
    ignore_name_scope: bool = False,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> tf.Tensor:
    """Reduce over the ranks, then rank i keeps the i-th block of rows; differentiable."""
    del device_dense
    compressed, ctx = compression.compress(tf.convert_to_tensor(tensor))
    key = op_name(name, REDUCESCATTER, ignore_name_scope)
    out = _reducescatter_diff(
        [compressed], key, op, float(prescale_factor), float(postscale_factor), process_set
    )[0]
    return compression.decompress(out, ctx)


def grouped_reducescatter(
    tensors: Sequence[Any],
    device_dense: str = "",
    compression: type[Compressor] = Compression.none,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: str | None = None,
    ignore_name_scope: bool = False,
) -> list[tf.Tensor]:
    """Reducescatter a list of tensors as one operation; differentiable."""
    del device_dense
    if not tensors:
        return []
    pairs = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]
    key = op_name(name, REDUCESCATTER, ignore_name_scope)
    outs = _reducescatter_diff(
        [p[0] for p in pairs],
        key,
        op,
        float(prescale_factor),
        float(postscale_factor),
        process_set,
    )
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(outs, pairs, strict=True)]
