"""Autograd for the collectives, with Horovod's gradients.

allreduce -> allreduce of the gradient (same op and scale factors); allgather -> average
allreduce narrowed to this rank's rows; broadcast -> average allreduce, zero off the root;
alltoall -> alltoall back with the received splits; reducescatter -> allgather (times size for
Sum).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd import Function

from hora.torch import mpi_ops
from hora.torch._common import Average, Sum


class HorovodAllreduce(Function):
    @staticmethod
    def forward(ctx: Any, tensor, name, op, prescale, postscale, process_set):  # type: ignore[override]
        ctx.args = (op, prescale, postscale, process_set)
        return mpi_ops.synchronize(
            mpi_ops._allreduce_async(
                [tensor], name, op, prescale, postscale, process_set, False, False
            )
        )

    @staticmethod
    def backward(ctx: Any, grad):  # type: ignore[override]
        op, prescale, postscale, process_set = ctx.args
        reduced = mpi_ops.allreduce(
            grad.contiguous(),
            op=op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=process_set,
        )
        return reduced, None, None, None, None, None


class HorovodGroupedAllreduce(Function):
    @staticmethod
    def forward(ctx: Any, name, op, prescale, postscale, process_set, *tensors):  # type: ignore[override]
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(
            mpi_ops.synchronize(
                mpi_ops._allreduce_async(
                    list(tensors), name, op, prescale, postscale, process_set, False, True
                )
            )
        )

    @staticmethod
    def backward(ctx: Any, *grads):  # type: ignore[override]
        op, prescale, postscale, process_set = ctx.args
        reduced = mpi_ops.grouped_allreduce(
            [g.contiguous() for g in grads],
            op=op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=process_set,
        )
        return (None, None, None, None, None, *reduced)


def _my_rows(dim: int, process_set: mpi_ops.ProcessSet) -> int:
    """Offset of this rank's rows in an allgather output."""
    dims = mpi_ops.allgather(torch.tensor([dim], dtype=torch.int64), process_set=process_set)
    index = process_set.ranks.index(mpi_ops.rank())
    return int(dims[:index].sum().item())


class HorovodAllgather(Function):
    @staticmethod
    def forward(ctx: Any, tensor, name, process_set):  # type: ignore[override]
        handle = mpi_ops._allgather_async([tensor], name, process_set, False)
        ctx.dim = tensor.shape[0]
        ctx.process_set = process_set
        return mpi_ops.synchronize(handle)

    @staticmethod
    def backward(ctx: Any, grad):  # type: ignore[override]
        reduced = mpi_ops.allreduce(grad.contiguous(), op=Average, process_set=ctx.process_set)
        offset = _my_rows(ctx.dim, ctx.process_set)
        return reduced.narrow(0, offset, ctx.dim), None, None


class HorovodGroupedAllgather(Function):
    @staticmethod
    def forward(ctx: Any, name, process_set, *tensors):  # type: ignore[override]
        handle = mpi_ops._allgather_async(list(tensors), name, process_set, True)
        ctx.dims = [t.shape[0] for t in tensors]
        ctx.process_set = process_set
        return tuple(mpi_ops.synchronize(handle))

    @staticmethod
    def backward(ctx: Any, *grads):  # type: ignore[override]
        reduced = mpi_ops.grouped_allreduce(
            [g.contiguous() for g in grads], op=Average, process_set=ctx.process_set
        )
        out = []
        for g, dim in zip(reduced, ctx.dims, strict=True):
            out.append(g.narrow(0, _my_rows(dim, ctx.process_set), dim))
        return (None, None, *out)


class HorovodBroadcast(Function):
    @staticmethod
    def forward(ctx: Any, tensor, root_rank, name, process_set):  # type: ignore[override]
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return mpi_ops.synchronize(
            mpi_ops._broadcast_async(tensor, root_rank, name, process_set, False)
        )

    @staticmethod
    def backward(ctx: Any, grad):  # type: ignore[override]
        reduced = mpi_ops.allreduce(grad.contiguous(), op=Average, process_set=ctx.process_set)
        if mpi_ops.rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


class HorovodAlltoall(Function):
    @staticmethod
    def forward(ctx: Any, tensor, splits, name, process_set):  # type: ignore[override]
        ctx.process_set = process_set
        ctx.shape = tensor.shape
        # The rows each rank sent here, also for an even split (ranks' dim 0 may differ): the
        # gradient goes back by exactly these splits.
        handle = mpi_ops._alltoall_async(tensor, splits, name, process_set, True)
        output, received = mpi_ops.synchronize(handle)
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, grad, _grad_splits):  # type: ignore[override]
        back, _ = mpi_ops.alltoall(grad.contiguous(), ctx.received, process_set=ctx.process_set)
        if back.shape[0] < ctx.shape[0]:  # rows that were not sent get no gradient
            pad = back.new_zeros((ctx.shape[0] - back.shape[0], *back.shape[1:]))
            back = torch.cat([back, pad])
        return back, None, None, None


class HorovodReducescatter(Function):
    @staticmethod
    def forward(ctx: Any, tensor, name, op, prescale, postscale, process_set):  # type: ignore[override]
        ctx.op = op
        ctx.process_set = process_set
        return mpi_ops.synchronize(
            mpi_ops._reducescatter_async(
                [tensor], name, op, prescale, postscale, process_set, False
            )
        )

    @staticmethod
    def backward(ctx: Any, grad):  # type: ignore[override]
        gathered = mpi_ops.allgather(grad.contiguous(), process_set=ctx.process_set)
        if ctx.op == Sum:
            gathered = gathered * len(ctx.process_set.ranks)
        return gathered, None, None, None, None, None


class HorovodGroupedReducescatter(Function):
    @staticmethod
    def forward(ctx: Any, name, op, prescale, postscale, process_set, *tensors):  # type: ignore[override]
        ctx.op = op
        ctx.process_set = process_set
        return tuple(
            mpi_ops.synchronize(
                mpi_ops._reducescatter_async(
                    list(tensors), name, op, prescale, postscale, process_set, True
                )
            )
        )

    @staticmethod
    def backward(ctx: Any, *grads):  # type: ignore[override]
        gathered = mpi_ops.grouped_allgather(
            [g.contiguous() for g in grads], process_set=ctx.process_set
        )
        if ctx.op == Sum:
            gathered = [g * len(ctx.process_set.ranks) for g in gathered]
        return (None, None, None, None, None, *gathered)
