"""Horovod's TensorFlow collectives (`horovod.tensorflow`), with Horovod's TF gradients.

Each op hands TF data to the shared collective loop (`hora.collectives`) through `_bridge` and is
differentiable through `tf.custom_gradient`, with the gradients Horovod registers for its TF ops:
allreduce -> allreduce of the gradient (same op and scale factors); allgather -> Average
allreduce, this rank's rows; broadcast -> Average allreduce, zero off the root; alltoall ->
alltoall back with the received splits (zero for rows not sent); reducescatter -> allgather,
times the set size for Sum and times the scale factors. Failures raise Horovod's TF error
classes (`_errors`); `rank_op` and its kin read the ranks when the graph runs, as Horovod's.
This module is the face: the differentiable allreduce and allgather every op and gradient is
made of are `_core_ops`, alltoall and reducescatter `_scatter_ops`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import tensorflow as tf
import torch

from hora.collectives import (
    Adasum,
    Average,
    ProcessSet,
    Sum,
    global_process_set,
    local_rank,
    local_size,
    rank,
    synchronize,
)
from hora.collectives import join as _join
from hora.collectives.framework import op_faces, process_set_by_id, resolve_op
from hora.collectives.ops import ALLGATHER, ALLREDUCE, BROADCAST, submit_broadcast
from hora.tensorflow import _bridge
from hora.tensorflow._core_ops import (
    NO_ADASUM,
    allgather_diff,
    allreduce_diff,
    op_name,
    traced_name,
)
from hora.tensorflow._scatter_ops import *  # noqa: F403 - listed in its __all__
from hora.tensorflow.compression import Compression, Compressor

# Each op's TF face (its spec's), here or in `_scatter_ops`, and the TF-only ops.
# mypy reads no computed __all__ (it would export nothing); without one it sees every public name.
if not TYPE_CHECKING:
    __all__ = [
        *op_faces("tensorflow"),
        "join",
        "local_rank_op",
        "local_size_op",
        "process_set_included_op",
        "rank_op",
        "size_op",
    ]


def _resolve_op(average: bool | None, op: int | None) -> int:
    if op == Adasum:
        raise NotImplementedError(NO_ADASUM)
    return resolve_op(average, op, stacklevel=4)  # the user's call of allreduce


def _sparse_allreduce(
    slices: tf.IndexedSlices, name: str | None, op: int, process_set: ProcessSet
) -> tf.IndexedSlices:
    """Horovod's IndexedSlices reduction: gather the values and the indices (only the touched
    rows travel); Average divides the values by the set size. Horovod gathers for Min, Max
    and Product too, which is a Sum once the slices are applied: hora refuses those."""
    if op not in (Average, Sum):
        raise NotImplementedError(
            "IndexedSlices allreduce supports only op=Average and op=Sum (the slices are "
            "gathered, so a Min, Max or Product would be a Sum); pass a dense tensor"
        )
    values = allgather(
        slices.values, name=None if name is None else f"{name}.values", process_set=process_set
    )
    indices = allgather(
        slices.indices, name=None if name is None else f"{name}.indices", process_set=process_set
    )
    if op == Average:
        values = values / tf.cast(len(process_set.ranks), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def _refuse_sparse_scaling(prescale_factor: float, postscale_factor: float) -> None:
    """Horovod's rule: IndexedSlices are gathered, not reduced, so no factor can apply."""
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotImplementedError(
            "prescale_factor and postscale_factor are not supported with tf.IndexedSlices; "
            "scale the gradient yourself, or pass sparse_as_dense=True to reduce it densely"
        )


def allreduce(
    tensor: Any,
    average: bool | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: type[Compressor] = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
    ignore_name_scope: bool = False,
) -> Any:
    """Reduce `tensor` over the ranks (Average by default); differentiable. IndexedSlices are
    gathered, as in Horovod. `device_dense`/`device_sparse` are accepted and ignored (the
    loop moves the data)."""
    del device_dense, device_sparse
    op = _resolve_op(average, op)
    if isinstance(tensor, tf.IndexedSlices):
        _refuse_sparse_scaling(prescale_factor, postscale_factor)
        return _sparse_allreduce(tensor, name, op, process_set)
    tensor = tf.convert_to_tensor(tensor)
    key = op_name(name, ALLREDUCE, ignore_name_scope)
    compressed, ctx = compression.compress(tensor)
    reduced = allreduce_diff(
        [compressed], key, op, float(prescale_factor), float(postscale_factor), process_set
    )[0]
    return compression.decompress(reduced, ctx)


def grouped_allreduce(
    tensors: Sequence[Any],
    average: bool | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: type[Compressor] = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    name: str | None = None,
    ignore_name_scope: bool = False,
) -> list[Any]:
    """Reduce a list of tensors as one fused operation; differentiable."""
    del device_dense, device_sparse
    op = _resolve_op(average, op)
    if not tensors:
        return []
    if any(isinstance(t, tf.IndexedSlices) for t in tensors):
        return [
            allreduce(
                t,
                op=op,
                compression=compression,
                prescale_factor=prescale_factor,
                postscale_factor=postscale_factor,
                process_set=process_set,
            )
            for t in tensors
        ]
    key = op_name(name, ALLREDUCE, ignore_name_scope)
    pairs = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]
    reduced = allreduce_diff(
        [p[0] for p in pairs],
        key,
        op,
        float(prescale_factor),
        float(postscale_factor),
        process_set,
    )
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(reduced, pairs, strict=True)]


def allgather(
    tensor: Any,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> tf.Tensor:
    """Concatenate every rank's `tensor` on dim 0 (which may differ); differentiable."""
    tensor = tf.convert_to_tensor(tensor)
    return allgather_diff([tensor], op_name(name, ALLGATHER, ignore_name_scope), process_set)[0]


def grouped_allgather(
    tensors: Sequence[Any],
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> list[tf.Tensor]:
    """Allgather a list of tensors as one operation; differentiable."""
    if not tensors:
        return []
    ts = [tf.convert_to_tensor(t) for t in tensors]
    return allgather_diff(ts, op_name(name, ALLGATHER, ignore_name_scope), process_set)


# ----- broadcast -------------------------------------------------------------------------------
def _broadcast_raw(
    tensor: tf.Tensor, root_rank: int, name: str | None, process_set: ProcessSet
) -> tf.Tensor:
    name = traced_name(name, BROADCAST)

    def call(ts: list[torch.Tensor]) -> list[torch.Tensor]:
        return [synchronize(submit_broadcast(ts[0], root_rank, name, process_set, False))]

    return _bridge.run(call, [tensor], [tensor.dtype], [tensor.shape], "HorovodBroadcast")[0]


def broadcast(
    tensor: Any,
    root_rank: int,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> tf.Tensor:
    """`root_rank`'s tensor on every rank; differentiable."""
    tensor = tf.convert_to_tensor(tensor)
    key = op_name(name, BROADCAST, ignore_name_scope)
    root = int(root_rank)

    @tf.custom_gradient
    def forward(x: tf.Tensor) -> Any:
        y = _broadcast_raw(x, root, key, process_set)

        def grad(dy: tf.Tensor) -> tf.Tensor:
            averaged = allreduce_diff([dy], None, Average, 1.0, 1.0, process_set)[0]
            return averaged if rank() == root else averaged * 0

        return y, grad

    return forward(tensor)


# ----- ranks and sizes as ops ------------------------------------------------------------------
def _read_op(read: Callable[[], int], name: str | None, op_name: str) -> tf.Tensor:
    """An int32 scalar got when the op runs, not when it is traced (as Horovod's: a graph built
    before `hvd.init()` reads the world it runs in); FailedPrecondition before `hvd.init()`."""

    def call(_: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.tensor(read(), dtype=torch.int32)]

    return _bridge.run(call, [], [tf.int32], [tf.TensorShape([])], name or op_name)[0]


def _process_set_ranks(process_set_id: int) -> list[int]:
    process_set = process_set_by_id(process_set_id)
    if process_set is None:
        raise ValueError(f"process set {process_set_id} is not registered")
    return process_set.ranks


def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """The number of ranks (of the process set `process_set_id`), read when the op runs."""
    return _read_op(lambda: len(_process_set_ranks(process_set_id)), name, "HorovodSize")


def local_size_op(name: str | None = None) -> tf.Tensor:
    """The number of ranks on this host, read when the op runs."""
    return _read_op(local_size, name, "HorovodLocalSize")


def rank_op(name: str | None = None) -> tf.Tensor:
    """This process's rank, read when the op runs."""
    return _read_op(rank, name, "HorovodRank")


def local_rank_op(name: str | None = None) -> tf.Tensor:
    """This process's rank on its host, read when the op runs."""
    return _read_op(local_rank, name, "HorovodLocalRank")


def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """1 if this rank belongs to the process set `process_set_id`, else 0, read when it runs."""

    def included() -> int:
        return int(rank() in _process_set_ranks(process_set_id))

    return _read_op(included, name, "HorovodProcessSetIncluded")


def join(name: str | None = None) -> tf.Tensor:
    """Horovod's TF join, an op: wait until every rank has joined (meanwhile this rank adds zeros
    to the others' allreduces) and return the rank that joined last, an int32 scalar."""
    return _read_op(_join, name, "HorovodJoin")
