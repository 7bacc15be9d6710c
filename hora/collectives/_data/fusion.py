"""Fusion buffers (Horovod's `fusion_buffer_manager.cc`): the memory a bucket of many tensors is
packed into, so that the transport moves them in one call.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._utils import _unflatten_dense_tensors

from hora.collectives._messages import Bucket

ALIGN = 16  # byte offsets inside a fused buffer, so that every slice can be viewed as its dtype


def aligned(n: int) -> int:
    """`n` bytes rounded up to the next aligned offset."""
    return (n + ALIGN - 1) // ALIGN * ALIGN


def cached_layout(bucket: Bucket) -> tuple[Any, ...] | None:
    """A bucket of response-cache hits only is laid out by its ids: an id stands for one
    request (dtypes and shapes included) and is never reused for another."""
    ids = tuple([e.cached for e in bucket.entries])
    return None if -1 in ids else ids


class FusionBuffer:
    """One persistent CPU buffer per dtype for in-place fused allreduces, and its views per
    bucket layout (the tensors' shapes in order), as Horovod keeps its fusion buffer.

    A fresh buffer per bucket costs page faults, and splitting it into views costs ~1.5 us of
    torch per tensor each way; a training step fuses the same layouts again and again, so the
    views are made once and the copies in and out are one `_foreach_copy_` each. Only in-place
    buckets use it: their results are copied out before the next bucket runs, so nothing of
    the buffer escapes to the caller.
    """

    MAX_LAYOUTS = 64  # layouts remembered; a model with more simply rebuilds the views

    def __init__(self) -> None:
        self._buffers: dict[torch.dtype, torch.Tensor] = {}
        self._layouts: dict[tuple[Any, ...], tuple[torch.Tensor, list[torch.Tensor]]] = {}

    def views(
        self, tensors: list[torch.Tensor], layout: tuple[Any, ...] | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The flat buffer for `tensors` (same dtype, CPU) and views of it shaped like each.
        `layout`: a key that fixes dtype and shapes (the entries' cache ids), cheaper to build
        than the shapes themselves."""
        dtype = tensors[0].dtype
        key = (dtype, layout) if layout is not None else (dtype, *[t.shape for t in tensors])
        hit = self._layouts.get(key)
        if hit is not None:
            return hit
        total = sum(t.numel() for t in tensors)
        buffer = self._buffers.get(dtype)
        if buffer is None or buffer.numel() < total:
            buffer = self._buffers[dtype] = torch.empty(total, dtype=dtype)
            for k in [k for k in self._layouts if k[0] == dtype]:
                del self._layouts[k]  # they view the buffer just replaced
        if len(self._layouts) >= self.MAX_LAYOUTS:
            self._layouts.clear()
        flat = buffer[:total]
        hit = self._layouts[key] = (flat, list(_unflatten_dense_tensors(flat, tensors)))
        return hit
