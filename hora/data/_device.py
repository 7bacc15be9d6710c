"""Batches to the GPU while the loop trains: `pin_memory` and `device` of a loader.

A batch is copied from pinned memory on a side CUDA stream one batch ahead, so the copy of
batch k+1 runs while the loop's kernels for batch k do; the loop's stream waits for the copy
only when it takes the batch (torch DataLoader pins in a thread and leaves the copy to the loop).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any


def to_device(
    batches: Iterator[dict[str, Any]], device: Any, pin: bool
) -> Iterator[dict[str, Any]]:
    """`batches` with their tensors pinned (`pin`) and on `device` (None: where they are)."""
    import torch

    target = torch.device(device) if device is not None else None
    if target is None or target.type != "cuda":
        if pin and not torch.cuda.is_available():
            warnings.warn(
                "pin_memory=True but no CUDA device is here: batches stay in pageable memory",
                stacklevel=3,
            )
            pin = False
        for batch in batches:
            yield _moved(batch, target, pin, non_blocking=False)
        return
    stream = torch.cuda.Stream(target)
    ahead: dict[str, Any] | None = None
    for batch in batches:
        with torch.cuda.stream(stream):
            copied = _moved(batch, target, True, non_blocking=True)
        if ahead is not None:
            yield _taken(torch, ahead, stream)
        ahead = copied
    if ahead is not None:
        yield _taken(torch, ahead, stream)


def _moved(batch: dict[str, Any], target: Any, pin: bool, non_blocking: bool) -> dict[str, Any]:
    out = {}
    for name, value in batch.items():
        if hasattr(value, "pin_memory") and hasattr(value, "to"):
            if pin and not value.is_pinned():
                value = value.pin_memory()
            if target is not None:
                value = value.to(target, non_blocking=non_blocking)
        out[name] = value
    return out


def _taken(torch: Any, batch: dict[str, Any], stream: Any) -> dict[str, Any]:
    """The loop's stream waits for the copy; the tensors are kept until its kernels are done."""
    current = torch.cuda.current_stream(stream.device)
    current.wait_stream(stream)
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.is_cuda:
            value.record_stream(current)
    return batch
