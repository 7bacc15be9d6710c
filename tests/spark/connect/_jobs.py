"""What the ranks run in the Spark Connect tests (imported by the ranks, from the driver's path)."""

from __future__ import annotations

import os
import signal
from typing import Any


def torch_train(scale: float) -> float:
    """pyspark's TorchDistributor contract: init_process_group() with no arguments."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    dist.destroy_process_group()
    return float(total) * scale


def deepspeed_ranks(deepspeed_config: Any = None) -> tuple[str, str, bool]:
    """DeepspeedTorchDistributor hands a function its config under this keyword (None here)."""
    return os.environ["RANK"], os.environ["WORLD_SIZE"], deepspeed_config is None


def killed_once() -> int:
    """Rank 1 is killed (SIGKILL) in the first attempt; every rank returns its attempt."""
    attempt = int(os.environ["HORA_RESTART_COUNT"])
    if attempt == 0 and os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    return attempt


def timeline_allreduce() -> list[float]:
    """One named allreduce through hora.torch, for the driver's timeline."""
    import torch

    import hora.torch as hvd

    hvd.init()
    result = hvd.allreduce(torch.ones(2) * (hvd.rank() + 1), name="connect.probe", op=hvd.Sum)
    hvd.shutdown()
    return result.tolist()
