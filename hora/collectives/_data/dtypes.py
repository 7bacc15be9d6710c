"""How each dtype travels: gloo lacks int16, and half precision is summed in float32 on CPU."""

from __future__ import annotations

import torch

_WIDEN_FOR_REDUCE_CPU = {
    torch.int16: torch.int32,
    torch.bool: torch.int32,
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
}
_WIDEN_FOR_REDUCE_CUDA = {torch.int16: torch.int32, torch.bool: torch.int32}


def dtype_name(dtype: torch.dtype) -> str:
    """The wire name of a dtype ("float32")."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype)
    return dtype


def reduce_dtype(dtype: torch.dtype, device_type: str) -> torch.dtype:
    """The dtype a reduction runs in: widened where a transport lacks the type or precision."""
    table = _WIDEN_FOR_REDUCE_CUDA if device_type == "cuda" else _WIDEN_FOR_REDUCE_CPU
    return table.get(dtype, dtype)


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor: every transport moves bytes, whatever the dtype."""
    return tensor.reshape(-1).view(torch.uint8)


def scale_(tensor: torch.Tensor, factor: float) -> None:
    """Multiply in place; integers are scaled in float64 and truncated back, as Horovod does."""
    if factor == 1.0:
        return
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.mul_(factor)
    elif tensor.dtype == torch.bool:
        tensor.copy_(tensor.double().mul_(factor) != 0)
    else:
        tensor.copy_(tensor.double().mul_(factor).to(tensor.dtype))


def cast_back_(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy a widened result into its original dtype (bool: non-zero is True)."""
    if dst.dtype == torch.bool and src.dtype != torch.bool:
        dst.copy_(src != 0)
    else:
        dst.copy_(src)
