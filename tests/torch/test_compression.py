"""hvd.Compression: fp16 halves floating tensors and restores their dtype; it leaves others alone.

Pure tensor functions: no processes needed. fp16 compression inside a real reduction is tested
with DistributedOptimizer in test_optimizer.
"""

from __future__ import annotations

import pytest
import torch

from hora.torch.compression import Compression


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fp16_round_trip_of_floating_tensors(dtype: torch.dtype) -> None:
    t = torch.linspace(-3, 3, 50, dtype=dtype)
    sent, ctx = Compression.fp16.compress(t)
    assert sent.dtype == torch.float16
    back = Compression.fp16.decompress(sent, ctx)
    assert back.dtype == dtype
    torch.testing.assert_close(back, t, atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize(
    "dtype", [torch.int32, torch.int64, torch.uint8, torch.bool, torch.float16]
)
def test_fp16_leaves_other_tensors_alone(dtype: torch.dtype) -> None:
    t = torch.ones(5, dtype=dtype)
    sent, ctx = Compression.fp16.compress(t)
    assert sent is t
    assert Compression.fp16.decompress(sent, ctx) is t


def test_none_is_the_identity() -> None:
    t = torch.randn(4)
    sent, ctx = Compression.none.compress(t)
    assert sent is t
    assert Compression.none.decompress(sent, ctx) is t


def test_fp16_loses_precision_and_range_as_float16_does() -> None:
    t = torch.tensor([1.0 + 2**-12, 1e6])
    back = Compression.fp16.decompress(*Compression.fp16.compress(t))
    assert back[0] == 1.0 and torch.isinf(back[1])
