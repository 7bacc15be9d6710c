"""The differentiable collectives (`hvd.allreduce` & co.): autograd with Horovod's gradients.

allreduce -> allreduce of the gradient (same op and scale factors); allgather -> average
allreduce narrowed to this rank's rows; broadcast -> average allreduce, zero off the root;
alltoall -> alltoall back with the received splits; reducescatter -> allgather (times size for
Sum).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.autograd import Function

from hora.collectives import Average, ProcessSet, Sum, global_process_set, rank, synchronize
from hora.collectives.framework import Tensors, op_faces, resolve_op
from hora.collectives.ops import (
    submit_allgather,
    submit_allreduce,
    submit_alltoall,
    submit_broadcast,
    submit_reducescatter,
)
from hora.torch.compression import Compression, Compressor

# The differentiable form of each op whose spec gives it a torch face (every one is defined here).
# mypy reads no computed __all__ (it would export nothing); without one it sees every public name.
if not TYPE_CHECKING:
    __all__ = op_faces("torch")


class HorovodAllreduce(Function):
    @staticmethod
    def forward(
        ctx: Any,
        tensor: torch.Tensor,
        name: str | None,
        op: int,
        prescale: float,
        postscale: float,
        process_set: ProcessSet,
    ) -> torch.Tensor:
        ctx.args = (op, prescale, postscale, process_set)
        return synchronize(
            submit_allreduce([tensor], name, op, prescale, postscale, process_set, False, False)
        )

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        op, prescale, postscale, process_set = ctx.args
        reduced = allreduce(
            grad.contiguous(),
            op=op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=process_set,
        )
        return reduced, None, None, None, None, None


class HorovodGroupedAllreduce(Function):
    @staticmethod
    def forward(
        ctx: Any,
        name: str | None,
        op: int,
        prescale: float,
        postscale: float,
        process_set: ProcessSet,
        *tensors: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(
            synchronize(
                submit_allreduce(
                    list(tensors), name, op, prescale, postscale, process_set, False, True
                )
            )
        )

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        op, prescale, postscale, process_set = ctx.args
        reduced = grouped_allreduce(
            [g.contiguous() for g in grads],
            op=op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=process_set,
        )
        return (None, None, None, None, None, *reduced)


def _my_rows(dim: int, process_set: ProcessSet) -> int:
    """Offset of this rank's rows in an allgather output."""
    dims = allgather(torch.tensor([dim], dtype=torch.int64), process_set=process_set)
    index = process_set.ranks.index(rank())
    return int(dims[:index].sum().item())


class HorovodAllgather(Function):
    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, name: str | None, process_set: ProcessSet
    ) -> torch.Tensor:
        handle = submit_allgather([tensor], name, process_set, False)
        ctx.dim = tensor.shape[0]
        ctx.process_set = process_set
        return synchronize(handle)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        reduced = allreduce(grad.contiguous(), op=Average, process_set=ctx.process_set)
        offset = _my_rows(ctx.dim, ctx.process_set)
        return reduced.narrow(0, offset, ctx.dim), None, None


class HorovodGroupedAllgather(Function):
    @staticmethod
    def forward(
        ctx: Any, name: str | None, process_set: ProcessSet, *tensors: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        handle = submit_allgather(list(tensors), name, process_set, True)
        ctx.dims = [t.shape[0] for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(handle))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        reduced = grouped_allreduce(
            [g.contiguous() for g in grads], op=Average, process_set=ctx.process_set
        )
        out = []
        for g, dim in zip(reduced, ctx.dims, strict=True):
            out.append(g.narrow(0, _my_rows(dim, ctx.process_set), dim))
        return (None, None, *out)


class HorovodBroadcast(Function):
    @staticmethod
    def forward(
        ctx: Any,
        tensor: torch.Tensor,
        root_rank: int,
        name: str | None,
        process_set: ProcessSet,
    ) -> torch.Tensor:
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return synchronize(submit_broadcast(tensor, root_rank, name, process_set, False))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        reduced = allreduce(grad.contiguous(), op=Average, process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


class HorovodAlltoall(Function):
    @staticmethod
    def forward(
        ctx: Any,
        tensor: torch.Tensor,
        splits: torch.Tensor | None,
        name: str | None,
        process_set: ProcessSet,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.process_set = process_set
        ctx.shape = tensor.shape
        # The rows each rank sent here, also for an even split (ranks' dim 0 may differ): the
        # gradient goes back by exactly these splits.
        handle = submit_alltoall(tensor, splits, name, process_set, True)
        output, received = synchronize(handle)
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(
        ctx: Any, grad: torch.Tensor, _grad_splits: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        back, _ = alltoall(grad.contiguous(), ctx.received, process_set=ctx.process_set)
        if back.shape[0] < ctx.shape[0]:  # rows that were not sent get no gradient
            pad = back.new_zeros((ctx.shape[0] - back.shape[0], *back.shape[1:]))
            back = torch.cat([back, pad])
        return back, None, None, None


class HorovodReducescatter(Function):
    @staticmethod
    def forward(
        ctx: Any,
        tensor: torch.Tensor,
        name: str | None,
        op: int,
        prescale: float,
        postscale: float,
        process_set: ProcessSet,
    ) -> torch.Tensor:
        ctx.op = op
        ctx.process_set = process_set
        return synchronize(
            submit_reducescatter([tensor], name, op, prescale, postscale, process_set, False)
        )

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        gathered = allgather(grad.contiguous(), process_set=ctx.process_set)
        if ctx.op == Sum:
            gathered = gathered * len(ctx.process_set.ranks)
        return gathered, None, None, None, None, None


class HorovodGroupedReducescatter(Function):
    @staticmethod
    def forward(
        ctx: Any,
        name: str | None,
        op: int,
        prescale: float,
        postscale: float,
        process_set: ProcessSet,
        *tensors: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        ctx.op = op
        ctx.process_set = process_set
        return tuple(
            synchronize(
                submit_reducescatter(
                    list(tensors), name, op, prescale, postscale, process_set, True
                )
            )
        )

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        gathered = grouped_allgather([g.contiguous() for g in grads], process_set=ctx.process_set)
        if ctx.op == Sum:
            gathered = [g * len(ctx.process_set.ranks) for g in gathered]
        return (None, None, None, None, None, *gathered)


# ----- the differentiable collectives (hvd.allreduce & co.) ---------------------------------------
def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Reduce `tensor` over the ranks (Average by default); differentiable."""
    op = resolve_op(average, op)
    compressed, ctx = compression.compress(tensor)
    reduced = HorovodAllreduce.apply(
        compressed, name, op, prescale_factor, postscale_factor, process_set
    )
    return compression.decompress(reduced, ctx)


def grouped_allreduce(
    tensors: Tensors,
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Reduce a list of tensors in one fused operation; differentiable."""
    op = resolve_op(average, op)
    pairs = [compression.compress(t) for t in tensors]
    reduced = HorovodGroupedAllreduce.apply(
        name, op, prescale_factor, postscale_factor, process_set, *[p[0] for p in pairs]
    )
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(reduced, pairs, strict=True)]


def allgather(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """Concatenate every rank's `tensor` on dim 0; differentiable."""
    return HorovodAllgather.apply(tensor, name, process_set)


def grouped_allgather(
    tensors: Tensors, name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[torch.Tensor]:
    """Allgather a list of tensors in one fused operation; differentiable."""
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


def broadcast(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """The root's tensor on every rank; differentiable."""
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


def alltoall(
    tensor: torch.Tensor,
    splits: torch.Tensor | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Scatter rows to every rank and gather theirs: the output, plus received splits if given."""
    output, received = HorovodAlltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


def reducescatter(
    tensor: torch.Tensor,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Reduce over the ranks and keep this rank's block of rows; differentiable."""
    compressed, ctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(
        compressed, name, op, prescale_factor, postscale_factor, process_set
    )
    return compression.decompress(out, ctx)


def grouped_reducescatter(
    tensors: Tensors,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Reducescatter a list of tensors as one operation; differentiable."""
    pairs = [compression.compress(t) for t in tensors]
    outs = HorovodGroupedReducescatter.apply(
        name, op, prescale_factor, postscale_factor, process_set, *[p[0] for p in pairs]
    )
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(outs, pairs, strict=True)]
