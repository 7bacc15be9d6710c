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


def test_pinned_buffers_are_found_again_over_100_epochs(tmp_path, monkeypatch):
    """100 epochs onto the GPU: the page-locked buffers the loader's thread fills are found
    again (a count of them, and torch's own pinned memory, stop growing after a few epochs),
    and the batches equal the CPU's."""
    from hora.data import _device

    made: list[int] = []
    real = _device.pinned

    def counted(nbytes: int):
        made.append(nbytes)
        return real(nbytes)

    monkeypatch.setattr(_device, "pinned", counted)
    dataset = hora.data.from_parquet(write_jpegs(tmp_path, 96))
    options = {"columns": ["id", "label", "image"], "transform": decode, "rank": 0, "size": 1}
    cpu = dataset.loader(16, num_workers=0, **options)
    gpu = dataset.loader(16, num_workers=2, pin_memory=True, device="cuda", **options)
    pinned_at: dict[int, int] = {}
    try:
        for epoch in range(100):
            cpu.set_epoch(epoch)
            gpu.set_epoch(epoch)
            for a, b in zip(cpu, gpu, strict=True):
                assert all(torch.equal(a[k], b[k].cpu()) for k in a), epoch
            stats = torch.cuda.host_memory_stats()
            pinned_at[epoch] = stats.get("reserved_bytes.current", stats.get("segment.current", 0))
            if epoch == 5:
                made_early = len(made)
    finally:
        gpu.close()
    bound = _device.DEPTH + _device.KEEP_FREE + 2
    assert 0 < made_early <= len(made) <= bound, made
    assert gpu._pinned().held <= bound
    assert pinned_at[99] <= pinned_at[5], pinned_at
