"""Worker functions specific to the Spark engine's tests (the shared ones are tests._workers)."""

from __future__ import annotations

import os
import socket
import time

ALL_CONTRACT = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK",
    "HOROVOD_CROSS_SIZE",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_RESTART_COUNT",
    "GLOO_SOCKET_IFNAME",
    "PYTHONUNBUFFERED",
    "HORA_WORKER",
    "USER_VAR",
)


def contract() -> dict[str, str | None]:
    """Every variable of the worker contract as this rank sees it (MASTER_PORT differs per run)."""
    return {name: os.environ.get(name) for name in ALL_CONTRACT}


def big_result(megabytes: int) -> bytes:
    rank = int(os.environ["RANK"])
    return bytes([rank]) * (megabytes << 20)


def whoami() -> tuple[int, int, str]:
    print(f"hello from rank {os.environ['RANK']}", flush=True)
    return int(os.environ["RANK"]), os.getpid(), socket.gethostname()


def fail_after_peer_started(rank: int) -> None:
    """`rank` raises once every rank is up (gloo init); the others block in a collective."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == rank:
        time.sleep(0.2)
        raise RuntimeError(f"deliberate failure on rank {rank}")
    dist.all_reduce(torch.ones(1))  # waits for the failed rank: must be stopped by hora
    time.sleep(3600)


def visible_gpus() -> tuple[str | None, str]:
    return os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ["LOCAL_RANK"]


def kill_own_spark_task(rank: int) -> None:
    """`rank` kills the Spark task supervising it (as an executor loss would); the rank lives on,
    and must be stopped by hora all the same."""
    if int(os.environ["RANK"]) == rank:
        import signal

        os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(3600)


def cuda_visible_devices() -> str | None:
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def task_context_view() -> dict:
    """What a rank sees of pyspark's TaskContext, as code written for the originals reads it."""
    import sys

    imported_before = "pyspark" in sys.modules  # hora must not import pyspark in a rank
    from pyspark import BarrierTaskContext, TaskContext

    ctx = BarrierTaskContext.get()
    ctx.barrier()
    return {
        "pyspark_imported_by_hora": imported_before,
        "same_context": TaskContext.get() is ctx,
        "rank": int(os.environ["RANK"]),
        "partition": ctx.partitionId(),
        "attempt": ctx.attemptNumber(),
        "stage": ctx.stageId(),
        "task_attempt_id": ctx.taskAttemptId(),
        "cpus": ctx.cpus(),
        "resources": {name: info.addresses for name, info in ctx.resources().items()},
        "task_infos": [info.address for info in ctx.getTaskInfos()],
        "gathered": ctx.allGather(f"rank {os.environ['RANK']}"),
        "local_property": ctx.getLocalProperty("hora.test.property"),
    }


def gpus_by_partition() -> list[str]:
    """spark-tensorflow-distributor's own test idiom: each task's CUDA_VISIBLE_DEVICES and
    GPU addresses, gathered in partition order through BarrierTaskContext.allGather."""
    import json

    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    mine = {
        "visible": os.environ["CUDA_VISIBLE_DEVICES"],
        "addresses": ctx.resources()["gpu"].addresses if "gpu" in ctx.resources() else [],
    }
    return ctx.allGather(json.dumps(mine))


def ddp_training(learning_rate: float) -> str:
    """pyspark's end-to-end test function: train with DDP, return "success"."""
    from tests.spark._pyspark_training_file import train

    return train(learning_rate)


def pythagoras(leg1: float, leg2: float) -> float:
    """pyspark's DeepSpeed end-to-end function (it imports deepspeed, as theirs does)."""
    import deepspeed

    print(deepspeed.__version__)
    return (leg1 * leg1 + leg2 * leg2) ** 0.5


TORCHRUN_NAMES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "NODE_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "CUDA_VISIBLE_DEVICES",
)


def torchrun_view() -> list[dict]:
    """Every rank's torchrun variables, whether torch sees a torchrun launch, and hora's own
    numbering (hvd.local_rank()), gathered to rank 0 (the doors return rank 0's value)."""
    import torch.distributed as dist

    import hora.torch as hvd

    dist.init_process_group("gloo")
    hvd.init()
    mine = {name: os.environ.get(name) for name in TORCHRUN_NAMES}
    mine |= {
        "torchelastic": dist.is_torchelastic_launched(),
        "hvd": (hvd.rank(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank()),
    }
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    hvd.shutdown()
    return every
