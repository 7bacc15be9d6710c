"""What this rank brings to one operation of a bucket, and where the data room leaves its
results: the one object the control room hands over with each agreed bucket."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(slots=True)  # one per operation: slots make it cheaper to build and read
class LocalOp:
    """What this rank submitted for one entry: its tensors, and whether to write into them."""

    tensors: list[torch.Tensor]
    inplace: bool
    outputs: list[Any] | None = None
    ready: Any = None  # a torch.cuda.Event recorded on the caller's stream at submission
