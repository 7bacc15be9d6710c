"""hora.data's loader on a GPU: `device="cuda"` batches land on the GPU, equal to the CPU's,
with workers and pinned memory; the copy of the next batch runs on a side stream."""

from __future__ import annotations

import pytest
import torch

import hora.data
from tests.data._images import decode, write_jpegs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_batches_reach_the_gpu_equal_to_the_cpus(tmp_path):
    dataset = hora.data.from_parquet(write_jpegs(tmp_path, 96))
    options = {"columns": ["id", "label", "image"], "transform": decode, "rank": 0, "size": 1}
    cpu = [b for b in dataset.loader(16, num_workers=0, **options)]
    gpu_loader = dataset.loader(16, num_workers=2, pin_memory=True, device="cuda", **options)
    try:
        gpu = list(gpu_loader)
        torch.cuda.synchronize()
    finally:
        gpu_loader.close()
    assert len(cpu) == len(gpu) == 6
    for a, b in zip(cpu, gpu, strict=True):
        assert all(v.is_cuda for v in b.values())
        assert all(torch.equal(a[k], b[k].cpu()) for k in a)
