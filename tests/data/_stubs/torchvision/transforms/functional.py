"""`to_tensor` for streaming's default vision transform: arrays only (no PIL here)."""

import numpy as np
import torch


def to_tensor(pic) -> torch.Tensor:
    """An HxWxC array as a CxHxW float tensor (scaled to [0, 1] when it holds bytes)."""
    array = np.asarray(pic)
    if array.ndim == 2:
        array = array[:, :, None]
    tensor = torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))
    return tensor.float().div(255) if tensor.dtype == torch.uint8 else tensor
