"""DistributedOptimizer's gradient buckets: how many gradients each allreduce call carries."""

from __future__ import annotations

import torch

from hora.torch._buckets import size_buckets


def test_the_first_gradient_bucket_closes_at_1_mib_as_ddps_8_mib_on_cpu(monkeypatch) -> None:
    def layers(device: str) -> list[torch.Tensor]:
        # in backward order: a small last layer, a 1 MiB weight, an 8 MiB one, earlier layers
        shapes = (10, 1 << 18, 1 << 21, 100, 5)
        return [torch.zeros(n, device=device) for n in shapes]

    def sizes(params: list[torch.Tensor]) -> list[list[int]]:
        return [[p.numel() for p in b] for b in size_buckets(params)]

    # "meta" stands for a GPU here: not CPU, so DDP's 1 MiB first bucket
    assert sizes(layers("meta")) == [[10, 1 << 18], [1 << 21, 100, 5]]
    assert sizes(layers("cpu")) == [[10, 1 << 18, 1 << 21], [100, 5]]
    small = [torch.zeros(1000, device="meta") for _ in range(300)]  # 1.2 MB, no tensor > 1 MiB
    assert [len(b) for b in size_buckets(small)] == [263, 37]
    cpu_small = [torch.zeros(1000) for _ in range(300)]  # one bucket on CPU
    assert [len(b) for b in size_buckets(cpu_small)] == [300]
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "0")  # one tensor per call, as before
    assert [len(b) for b in size_buckets(layers("cpu"))] == [1, 1, 1, 1, 1]
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "8000")
    assert [len(b) for b in size_buckets(cpu_small)] == [2] * 150
