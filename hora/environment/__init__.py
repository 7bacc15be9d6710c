"""The worker contract read back: where this process sits, whatever launched it.

`current()` reads any launcher's variables (hora's, horovodrun's, torchrun's,
TorchDistributor's): hora.torch, hora.checkpoint, hora.data and the Spark doors all ask here. The
same variables are written by `hora.environment.build` (on the driver, or a cluster rank's
supervisor); the GPUs a rank sees are chosen by `hora.environment.gpus`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from hora.placement import RankPlacement

RUN_ID_VAR = "HORA_RUN_ID"
ELASTIC_VAR = "HORA_ELASTIC"
#: "0" (on the driver, it reaches the ranks) keeps an elastic run off every resize in place
IN_PLACE_VAR = "HORA_ELASTIC_IN_PLACE"
#: which of the run's worlds re-formed in place this process belongs to (0 or unset: the
#: attempt's first, rendezvoused by env://); a rank started to grow a world in place gets it
GENERATION_VAR = "HORA_WORLD_GENERATION"
#: Set by the doors that run, as pyspark's TorchDistributor does on Spark, one torchrun per task:
#: the rank's torchrun names then count within its task (`task_view`)
PER_TASK_VAR = "HORA_TORCHRUN_PER_TASK"


@dataclass(frozen=True)
class RankEnvironment:
    """What a process learns of its place from its environment: `current()`'s answer.

    Any launcher's variables are read: hora's, horovodrun's, torchrun's, TorchDistributor's;
    a field is None where no launcher set it.
    """

    rank: int | None
    size: int | None
    #: every coordinate, when the launcher gave all of them (hora and horovodrun do)
    placement: RankPlacement | None
    #: the rendezvous host and port (MASTER_ADDR, MASTER_PORT): the store every rank dials
    master_addr: str | None
    master_port: int | None
    #: which attempt of a restarted run this is (0: the first), and how many restarts it allows
    attempt: int
    max_restarts: int | None
    #: the run's id, the same in every attempt (HORA_RUN_ID): where its commits are kept
    run_id: str | None = None
    #: whether the run may change its size (min_np/max_np): ranks then check for more slots at
    #: every commit
    elastic: bool = False
    #: the world re-formed in place this process is in (GENERATION_VAR; 0: the attempt's first)
    generation: int = 0


def current(environ: Mapping[str, str] | None = None) -> RankEnvironment:
    """This process's place, read from `environ` (default: os.environ) on every call.

    The one reader of the contract `hora.environment.build` writes (`worker_env`,
    `restart_env`, `run_env`).
    """
    env = os.environ if environ is None else environ
    rank = _int(env, "RANK", "HOROVOD_RANK")
    size = _int(env, "WORLD_SIZE", "HOROVOD_SIZE")
    coordinates = (
        _int(env, "HOROVOD_LOCAL_RANK", "LOCAL_RANK"),
        _int(env, "HOROVOD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"),
        _int(env, "HOROVOD_CROSS_RANK", "GROUP_RANK"),
        _int(env, "HOROVOD_CROSS_SIZE", "GROUP_WORLD_SIZE"),
    )
    placement = None
    if rank is not None and size is not None and None not in coordinates:
        placement = RankPlacement(rank, size, *coordinates)  # type: ignore[arg-type]
    return RankEnvironment(
        rank=rank,
        size=size,
        placement=placement,
        master_addr=env.get("MASTER_ADDR") or None,
        master_port=_int(env, "MASTER_PORT"),
        attempt=_int(env, "HORA_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT") or 0,
        max_restarts=_int(env, "HORA_MAX_RESTARTS", "TORCHELASTIC_MAX_RESTARTS"),
        run_id=env.get(RUN_ID_VAR) or None,
        elastic=env.get(ELASTIC_VAR) == "1",
        generation=_int(env, GENERATION_VAR) or 0,
    )


def _int(env: Mapping[str, str], *names: str) -> int | None:
    """The first of `names` set in `env`, as an int; None if none is set."""
    for name in names:
        value = env.get(name, "")
        if value:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"{name}={value!r} is not an integer") from None
    return None


def may_reform_in_place(env: Mapping[str, str]) -> bool:
    """Whether the ranks of an attempt with this environment may re-form their world in place:
    an elastic run's, unless HORA_ELASTIC_IN_PLACE=0."""
    return env.get(ELASTIC_VAR) == "1" and env.get(IN_PLACE_VAR, "1") != "0"


def task_view(environ: Mapping[str, str]) -> dict[str, str]:
    """What a rank of a door marked with PER_TASK_VAR sees instead of the per-host numbering:
    pyspark's TorchDistributor on Spark starts one `torchrun --nnodes=<tasks>
    --node_rank=<task>` of one process in each task, so LOCAL_RANK is 0, LOCAL_WORLD_SIZE 1,
    GROUP_RANK and NODE_RANK the task's index, and CUDA_VISIBLE_DEVICES the task's own GPU
    (Lightning's `Trainer(devices=1, num_nodes=N)` needs that). Empty without the mark.

    Only torchrun's names change: Horovod's (hora's own collectives, `hvd.local_rank()`) and the
    deepspeed launcher's (DeepSpeed's shared-memory allreduce) keep counting the host's ranks.
    """
    if environ.get(PER_TASK_VAR) != "1":
        return {}
    rank, size = environ["RANK"], environ["WORLD_SIZE"]
    view = {
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": rank,
        "GROUP_WORLD_SIZE": size,
        "NODE_RANK": rank,
    }
    # `gpus.visible_gpus` shows a rank with one GPU those of its host's ranks, in local-rank order;
    # a task of pyspark's sees only its own.
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    local_rank, local_size = (
        _int(environ, "HOROVOD_LOCAL_RANK"),
        _int(environ, "HOROVOD_LOCAL_SIZE"),
    )
    if visible and local_rank is not None and local_size is not None and local_size > 1:
        gpus = [g.strip() for g in visible.split(",") if g.strip()]
        if len(gpus) == local_size:
            view["CUDA_VISIBLE_DEVICES"] = gpus[local_rank]
    return view
