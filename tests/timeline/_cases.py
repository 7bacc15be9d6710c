"""Worker functions of the timeline tests: each runs inside a real rank (hora.run or bare).

Several checks share one job because every rank pays ~1-2 s to import torch.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

PROBES = ("probe.allreduce", "probe.allgather", "probe.broadcast", "probe.grouped")


def _start_error(hvd: Any) -> str:
    try:
        hvd.start_timeline("never-written.json")
    except ValueError as exc:
        return str(exc)
    return "no error"


def traced_job(rank_dir: str) -> dict[str, Any]:
    """HOROVOD_TIMELINE=<relative path> on the driver: a small training loop, probes, regions.

    The rank works in `rank_dir`, not the driver's folder: a file the rank wrote itself would
    land there, the driver's lands where the driver asked.
    """
    os.chdir(rank_dir)
    import torch
    from torch import nn

    import hora.torch as hvd

    hvd.init()
    rank = hvd.rank()
    out: dict[str, Any] = {"start_timeline": _start_error(hvd)}

    @hvd.timeline_context("decorated")
    def evaluate(model: nn.Module, x: torch.Tensor) -> float:
        with torch.no_grad():
            return float(model(x).sum())

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x = torch.randn(5, 8) + rank
    for _ in range(3):
        opt.zero_grad()
        with hvd.timeline_context("forward"):
            loss = model(x).pow(2).mean()
        with hvd.timeline_context("backward"):
            loss.backward()
        opt.step()
    evaluate(model, x)
    hvd.allreduce(torch.ones(4), name="probe.allreduce")
    hvd.allgather(torch.full((2, 3), float(rank)), name="probe.allgather")
    hvd.broadcast(torch.ones(5), root_rank=0, name="probe.broadcast")
    hvd.grouped_allreduce([torch.ones(3), torch.ones(2, dtype=torch.float64)], name="probe.grouped")
    hvd.allreduce(torch.ones(1))  # an unnamed op
    out["files_here"] = sorted(os.listdir("."))
    return out


def dynamic_job(path: str) -> None:
    """HOROVOD_TIMELINE=DYNAMIC: only what runs between start and stop is recorded."""
    import torch

    import hora.torch as hvd

    hvd.init()
    one = torch.ones(2)
    hvd.allreduce(one, name="before")
    hvd.start_timeline(path, mark_cycles=True)
    for i in range(3):
        with hvd.timeline_context("compute"):
            time.sleep(0.001)
        hvd.allreduce(one, name=f"during.{i}")
    hvd.stop_timeline()
    hvd.allreduce(one, name="after")
    hvd.stop_timeline()  # a second stop does nothing


def unset_job() -> str:
    """No timeline variable: collectives work, and start_timeline says how to enable it."""
    import torch

    import hora.torch as hvd

    hvd.init()
    hvd.allreduce(torch.ones(2), name="quiet")
    with hvd.timeline_context("nothing"):
        pass
    return _start_error(hvd)


def killed_job() -> None:
    """Rank 1 is SIGKILLed after its first events were shipped; rank 0 waits in a collective."""
    import torch

    import hora.torch as hvd

    hvd.init()
    for i in range(5):
        hvd.allreduce(torch.ones(3), name=f"k.{i}")
    time.sleep(0.8)  # past a flush of both ranks
    if hvd.rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    hvd.allreduce(torch.ones(3), name="k.never")


def bare_rank() -> None:
    """A rank started without hora's launcher (torchrun's variables): it writes the file itself."""
    import torch

    import hora.torch as hvd

    hvd.init()
    for i in range(3):
        with hvd.timeline_context("step"):
            hvd.allreduce(torch.ones(4) * hvd.rank(), name=f"bare.{i}")
    hvd.shutdown()


if __name__ == "__main__":
    globals()[sys.argv[1]]()
