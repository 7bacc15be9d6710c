"""Gradient compression applied around a reduction: Horovod's `hvd.Compression`.

`compress(t)` returns what travels and a context; `decompress(t, ctx)` restores the original
dtype. fp16 halves the bytes on the wire; it leaves integer and bool tensors alone because
casting them to half would lose values.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]


class Compressor:
    """Interface: a pair of static methods, so the class itself is the compressor."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends the tensor as it is."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16; the context is the original dtype."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        dtype = tensor.dtype
        if dtype.is_floating_point and dtype != torch.float16:
            tensor = tensor.to(torch.float16)
        return tensor, dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        dtype = ctx
        if dtype is not None and dtype.is_floating_point and tensor.dtype != dtype:
            tensor = tensor.to(dtype)
        return tensor


class Compression:
    """`Compression.none` and `Compression.fp16`, the names Horovod scripts use."""

    none = NoneCompressor
    fp16 = FP16Compressor
