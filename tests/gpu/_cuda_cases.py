"""Worker functions of the CUDA tests: run inside ranks that pin a GPU by local rank."""

from __future__ import annotations

import os

import torch


def _pin_gpu() -> torch.device:
    gpu = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    torch.cuda.set_device(gpu)
    return torch.device("cuda", gpu)


def run_all_on_cuda() -> tuple[dict[str, str], dict[str, int]]:
    """The CPU conformance cases with every tensor they make on this rank's GPU."""
    from hora.collectives._data import transports as _backends
    from tests.collectives import _cases

    torch.set_default_device(_pin_gpu())
    outcomes = _cases.run_all()
    return outcomes, dict(_backends.stats)


def train_on_cuda() -> tuple[float, float]:
    """A few DistributedOptimizer steps of a small regression on the GPU; loss before and after."""
    import hora.torch as hvd

    hvd.init()
    device = _pin_gpu()
    torch.manual_seed(0)
    x = torch.randn(256, 16, device=device)
    y = x @ torch.randn(16, 1, device=device)
    torch.manual_seed(hvd.rank())
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    model.to(device)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    shard = slice(hvd.rank(), None, hvd.size())

    def full_loss() -> float:
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(model(x), y))

    first = full_loss()
    for _ in range(200):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[shard]), y[shard]).backward()
        opt.step()
    last = full_loss()
    hvd.shutdown()
    return first, last
