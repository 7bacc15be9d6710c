"""`hvd.SyncBatchNorm`: batch statistics over every rank's batch, on CPU as well as on GPU.

With small per-rank batches, each rank's own mean and variance are noisy; this layer normalises
with the statistics of the global batch, exactly as `BatchNorm` would on one process holding all
of it. Forward sends one allgather of (count, mean, M2) per layer, merged with Chan's parallel
variance formula (no cancellation from sums of squares); backward one allreduce of two sums.
Weight and bias gradients stay local, so DistributedOptimizer averages them like any other.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.nn.modules.batchnorm import _BatchNorm

from hora.torch.mpi_ops import Sum, allgather, allreduce, size

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_BatchNorm):
    """BatchNorm whose training statistics are those of the global batch across all ranks.

    Takes any input of shape (N, C, ...). In eval mode (with running statistics) it is plain
    local BatchNorm. Ranks may hold different batch sizes, even empty ones.
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        momentum = 0.0 if self.momentum is None else self.momentum
        tracked = self.num_batches_tracked  # a tensor whenever track_running_stats is on
        if self.training and self.track_running_stats and tracked is not None:
            tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                momentum = 1.0 / float(tracked)
        use_batch_stats = self.training or not self.track_running_stats
        if not use_batch_stats or size() == 1:
            return F.batch_norm(
                input,
                self.running_mean,
                self.running_var,
                self.weight,
                self.bias,
                use_batch_stats,
                momentum,
                self.eps,
            )
        running = self.training and self.track_running_stats
        return _SyncBatchNormFn.apply(
            input,
            self.weight,
            self.bias,
            self.running_mean if running else None,
            self.running_var if running else None,
            self.eps,
            momentum,
        )


def _stats_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


class _SyncBatchNormFn(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        running_mean: torch.Tensor | None,
        running_var: torch.Tensor | None,
        eps: float,
        momentum: float,
    ) -> torch.Tensor:
        channels = x.shape[1]
        dims = [d for d in range(x.dim()) if d != 1]
        xs = x.to(_stats_dtype(x.dtype))
        count = x.numel() // channels if channels else 0
        if count:
            var, mean = torch.var_mean(xs, dim=dims, unbiased=False)
            m2 = var * count
        else:
            mean = m2 = xs.new_zeros(channels)
        local = torch.cat([xs.new_tensor([float(count)]), mean, m2]).unsqueeze(0)
        gathered = allgather(local, name=None)  # (ranks, 1 + 2C)
        counts, means, m2s = (
            gathered[:, :1],
            gathered[:, 1 : 1 + channels],
            gathered[:, 1 + channels :],
        )
        total = counts.sum()
        if total == 0:
            raise ValueError("SyncBatchNorm: every rank's batch is empty")
        g_mean = (counts * means).sum(0) / total
        g_m2 = (m2s + counts * (means - g_mean) ** 2).sum(0)
        g_var = g_m2 / total
        invstd = torch.rsqrt(g_var + eps)

        if running_mean is not None and running_var is not None:
            unbiased = g_m2 / (total - 1) if total > 1 else g_var
            running_mean.mul_(1 - momentum).add_(g_mean.to(running_mean.dtype), alpha=momentum)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)

        shape = [1, channels] + [1] * (x.dim() - 2)
        xhat = (xs - g_mean.view(shape)) * invstd.view(shape)
        y = xhat
        if weight is not None:
            y = y * weight.to(xs.dtype).view(shape)
        if bias is not None:
            y = y + bias.to(xs.dtype).view(shape)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.total = float(total)
        ctx.param_dtype = (weight if weight is not None else x).dtype
        ctx.in_dtype = x.dtype
        return y.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        xhat, invstd, weight = ctx.saved_tensors
        channels = xhat.shape[1]
        dims = [d for d in range(xhat.dim()) if d != 1]
        shape = [1, channels] + [1] * (xhat.dim() - 2)
        dy = dy.to(xhat.dtype)
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * xhat).sum(dims)
        grad_weight = sum_dy_xhat.to(ctx.param_dtype) if ctx.needs_input_grad[1] else None
        grad_bias = sum_dy.to(ctx.param_dtype) if ctx.needs_input_grad[2] else None
        grad_x = None
        if ctx.needs_input_grad[0]:
            both = allreduce(torch.cat([sum_dy, sum_dy_xhat]), op=Sum)
            g_dy, g_dy_xhat = both[:channels], both[channels:]
            scale = invstd if weight is None else invstd * weight.to(xhat.dtype)
            grad_x = (
                dy - (g_dy / ctx.total).view(shape) - xhat * (g_dy_xhat / ctx.total).view(shape)
            ) * scale.view(shape)
            grad_x = grad_x.to(ctx.in_dtype)
        return grad_x, grad_weight, grad_bias, None, None, None, None
