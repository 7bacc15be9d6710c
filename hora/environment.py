"""The worker contract: the environment every rank sees, whatever engine started it.

One function builds it for local processes and Spark tasks alike, so the same `main` runs
unchanged on both. The variables are torchrun's (so `init_process_group("gloo")` with no
arguments works) plus Horovod's (so `hvd.init()` finds its place) plus the `deepspeed` launcher's
(so `deepspeed.init_distributed()` and DeepSpeed's accelerator see what they would under it).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hora.wire.protocol import RankPlacement as RankPlacement

# Tells torch.distributed that the launcher hosts the TCPStore at MASTER_ADDR:MASTER_PORT and every
# rank, rank 0 included, connects to it as a client. The launcher binds that port itself and keeps
# it, so no rank ever races to bind a port somebody else might take.
AGENT_STORE_VARS = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0"}

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

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

# Set on the driver, they reach every rank even where workers do not inherit the driver's
# environment (Spark executors): the timeline is asked for on the driver and written there; the
# stall inspector's times are the job's too (its warnings are read on the driver), and so are the
# switches of the hierarchical data path (every rank must choose alike), and whether an elastic
# run's survivors re-form in place (and how long they wait for the driver's word).
DRIVER_VARS = (
    "HOROVOD_TIMELINE",
    "HORA_TIMELINE",
    "HOROVOD_TIMELINE_MARK_CYCLES",
    "HOROVOD_STALL_CHECK_DISABLE",
    "HOROVOD_STALL_CHECK_TIME_SECONDS",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
    "HOROVOD_HIERARCHICAL_ALLREDUCE",
    "HOROVOD_HIERARCHICAL_ALLGATHER",
    "HORA_ELASTIC_IN_PLACE",
    "HORA_ELASTIC_REFORM_WAIT_SECONDS",
)


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

    The one reader of the contract `worker_env` and `restart_env` write: hora.torch,
    hora.checkpoint and the Spark doors all ask here.
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


def placements(hosts: list[str]) -> list[RankPlacement]:
    """Placements for ranks given each rank's host, in rank order.

    Local ranks count the ranks on the same host; cross ranks number the hosts in order of their
    first rank, as Horovod does.
    """
    host_order: list[str] = []
    for host in hosts:
        if host not in host_order:
            host_order.append(host)
    per_host = {host: [r for r, h in enumerate(hosts) if h == host] for host in host_order}
    return [
        RankPlacement(
            rank=rank,
            size=len(hosts),
            local_rank=per_host[host].index(rank),
            local_size=len(per_host[host]),
            cross_rank=host_order.index(host),
            cross_size=len(host_order),
        )
        for rank, host in enumerate(hosts)
    ]


def host_order(hosts: list[str]) -> list[int]:
    """Slots (indexes into `hosts`) in rank order: the ranks of one host are contiguous, as
    Horovod and torchrun number them; hosts come in the order of their first slot, and slots
    keep their order within a host (so slot 0 stays rank 0)."""
    first: dict[str, int] = {}
    for slot, host in enumerate(hosts):
        first.setdefault(host, slot)
    return sorted(range(len(hosts)), key=lambda slot: (first[hosts[slot]], slot))


def joining_order(running: list[str], new: list[str]) -> list[int]:
    """New slots (indexes into `new`, their hosts) in the order of the ranks they get after the
    `running` ranks' (on these hosts, in rank order), who keep theirs: those on a running host
    first, host by host as its ranks come, then new hosts, so each host's ranks stay as
    contiguous as they can."""
    return [slot - len(running) for slot in host_order(running + new) if slot >= len(running)]


def threads_per_rank(local_size: int, cores: int | None = None) -> int:
    """CPU threads each rank may use so that `local_size` ranks do not oversubscribe the host."""
    cores = cores or os.cpu_count() or 1
    return max(1, cores // max(1, local_size))


def worker_env(
    placement: RankPlacement,
    master_addr: str,
    master_port: int,
    *,
    agent_store: bool = True,
    cores: int | None = None,
    base: Mapping[str, str] | None = None,
    user_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A worker's whole environment: `base` (the launcher's own), the contract, then `user_env`.

    Thread counts, the OpenMP wait policy and the gloo interface are defaults: a value already in
    `base` is kept.
    """
    env = dict(os.environ if base is None else base)
    env |= placement_env(placement)
    env |= {
        "ROLE_NAME": "default",  # torchrun's --role
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "PYTHONUNBUFFERED": "1",
    }
    if agent_store:
        env.update(AGENT_STORE_VARS)
    threads = str(threads_per_rank(placement.local_size, cores))
    for name in THREAD_VARS:
        env.setdefault(name, threads)
    # OpenMP workers that spin after each op hold the cores that communication threads need: on a
    # 16-core host hvd.DistributedOptimizer ran at 0.24x-0.33x DDP with spinning, 0.91x-1.00x
    # with PASSIVE (bench/README.md); DDP itself was no slower.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # torchrun's default
    if master_addr in ("127.0.0.1", "localhost"):
        # gloo otherwise resolves the hostname, which may point at an external interface.
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.update(user_env or {})
    return env


def placement_env(placement: RankPlacement) -> dict[str, str]:
    """A rank's coordinates under every launcher's names (hora's, torchrun's, Horovod's,
    DeepSpeed's); a world re-formed in place writes them again."""
    p = placement
    return {
        "RANK": str(p.rank),
        "WORLD_SIZE": str(p.size),
        "LOCAL_RANK": str(p.local_rank),
        "LOCAL_WORLD_SIZE": str(p.local_size),
        "GROUP_RANK": str(p.cross_rank),
        "GROUP_WORLD_SIZE": str(p.cross_size),
        "ROLE_RANK": str(p.rank),
        "ROLE_WORLD_SIZE": str(p.size),
        "HOROVOD_RANK": str(p.rank),
        "HOROVOD_SIZE": str(p.size),
        "HOROVOD_LOCAL_RANK": str(p.local_rank),
        "HOROVOD_LOCAL_SIZE": str(p.local_size),
        "HOROVOD_CROSS_RANK": str(p.cross_rank),
        "HOROVOD_CROSS_SIZE": str(p.cross_size),
        # The `deepspeed` launcher's names; DeepSpeed's CPU accelerator counts its devices by
        # LOCAL_SIZE (else by NUMA nodes), and its checkpoint placement reads CROSS_*.
        "LOCAL_SIZE": str(p.local_size),
        "CROSS_RANK": str(p.cross_rank),
        "CROSS_SIZE": str(p.cross_size),
    }


def restart_env(restart_count: int, max_restarts: int) -> dict[str, str]:
    """Which attempt of the run this is, under hora's names and torchrun's.

    A rank can skip work only the first attempt should do (or fail only there, in a test); torch
    also prefixes the agent store's keys with TORCHELASTIC_RESTART_COUNT.
    """
    return {
        "HORA_RESTART_COUNT": str(restart_count),
        "HORA_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
    }


def may_reform_in_place(env: Mapping[str, str]) -> bool:
    """Whether the ranks of an attempt with this environment may re-form their world in place:
    an elastic run's, unless HORA_ELASTIC_IN_PLACE=0."""
    return env.get(ELASTIC_VAR) == "1" and env.get(IN_PLACE_VAR, "1") != "0"


def run_env(run_id: str, elastic: bool) -> dict[str, str]:
    """The run's id (every attempt's), and whether it is elastic. The id is torchrun's too:
    TORCHELASTIC_RUN_ID is how frameworks tell a torchrun-style launch
    (`torch.distributed.is_torchelastic_launched()`: Lightning and Fabric then read RANK and
    WORLD_SIZE instead of deriving ranks from devices x num_nodes). An elastic run's ranks also
    get Horovod's HOROVOD_ELASTIC=1, as horovodrun's do: a DistributedOptimizer made in a world
    of one still reduces, so it works on once the world grows in place."""
    ids = {RUN_ID_VAR: run_id, "TORCHELASTIC_RUN_ID": run_id}
    return ids | ({ELASTIC_VAR: "1", "HOROVOD_ELASTIC": "1"} if elastic else {})


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
    # `visible_gpus` shows a rank with one GPU those of its host's ranks, in local-rank order;
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


def driver_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The DRIVER_VARS set in the driver's environment, to pass to every worker."""
    env = os.environ if environ is None else environ
    return {name: env[name] for name in DRIVER_VARS if env.get(name)}


def driver_sys_path() -> list[str]:
    """The driver's import path, for the workers: modules it can import (a notebook's
    sys.path.append too) unpickle in them; '' (the current folder) made absolute. On a cluster,
    entries missing on the worker's host are harmless."""
    return [os.path.abspath(p) if p == "" else p for p in sys.path]


def local_gpus() -> list[str]:
    """This machine's GPUs as CUDA numbers them for this process: CUDA_VISIBLE_DEVICES when set,
    else every device torch counts."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip()]
    import torch  # only when asked: `import hora` stays light

    return [str(i) for i in range(torch.cuda.device_count())]


def cuda_devices(addresses: list[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """The CUDA devices behind a cluster's GPU `addresses`, as pyspark's TorchDistributor and
    spark-tensorflow-distributor read them: indexes into this process's CUDA_VISIBLE_DEVICES
    when that is set (a driver or executor given GPUs 3,4,5 reports them as 0,1,2), else the
    devices themselves. A ValueError (pyspark's) when an address cannot be such an index."""
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(addresses)
    devices = [d.strip() for d in visible.split(",") if d.strip()]
    wrong = [a for a in addresses if not _CUDA_INDEX.match(a) or int(a) >= len(devices)]
    if wrong:
        raise ValueError(
            f"GPU addresses {list(addresses)} must be indexes into CUDA_VISIBLE_DEVICES="
            f"{visible!r} (integers with no zero padding, below {len(devices)}): {wrong} are "
            "not. Make the GPU discovery script report them so, or unset CUDA_VISIBLE_DEVICES"
        )
    return [devices[int(a)] for a in addresses]


_CUDA_INDEX = re.compile(r"^(0|[1-9][0-9]*)$")


def supervised_rank_env(
    rank: int,
    ranks: list[dict[str, Any]],
    master: tuple[str, int],
    use_gpu: bool,
    base: Mapping[str, str],
    own_gpus: bool = False,
) -> dict[str, str]:
    """`rank`'s environment on a cluster engine, from what every rank's supervisor (a Spark
    task, a Ray actor) reported: its `host`, `gpus` and `cpus`. `own_gpus`: the rank sees only
    its own GPUs (see `visible_gpus`).

    Built by `worker_env`, as in local mode, so the same `main` runs on every engine.
    """
    hosts = [r["host"] for r in ranks]
    place = placements(hosts)[rank]
    cpus = max(1, int(ranks[rank]["cpus"]))
    env = worker_env(
        place,
        master[0],
        master[1],
        base=base,
        cores=cpus * place.local_size,  # each rank gets its own share of threads
    )
    if use_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible_gpus(rank, hosts, ranks, own_gpus))
    return env


def visible_gpus(
    rank: int, hosts: list[str], ranks: list[dict[str, Any]], own_only: bool = False
) -> list[str]:
    """CUDA_VISIBLE_DEVICES for `rank`, chosen so that `cuda:LOCAL_RANK` is its own GPU.

    With one GPU per rank (the usual `spark.task.resource.gpu.amount=1`, or one GPU per Ray
    bundle) every rank sees the GPUs of this job's ranks on its host, in local-rank order, so
    `torch.cuda.set_device(local_rank)` picks the GPU the cluster assigned to it. Otherwise
    (several GPUs per rank, or addresses that repeat across executors), or with `own_only` (a
    TensorFlow worker uses every GPU it sees), a rank sees only its own GPUs, as pyspark's
    TorchDistributor does.
    """
    own = list(ranks[rank]["gpus"])
    if own_only:
        return own
    local = [r["gpus"] for r, h in zip(ranks, hosts, strict=True) if h == hosts[rank]]
    flat = [g for gpus in local for g in gpus]
    if all(len(gpus) == 1 for gpus in local) and len(set(flat)) == len(flat):
        return flat
    return own
