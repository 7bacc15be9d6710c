"""The worker contract written: the environment every rank starts with, whatever engine starts it.

One function builds it for local processes and cluster ranks alike, so the same `main` runs
unchanged on every engine. The variables are torchrun's (so `init_process_group("gloo")` with no
arguments works) plus Horovod's (so `hvd.init()` finds its place) plus the `deepspeed` launcher's
(so `deepspeed.init_distributed()` and DeepSpeed's accelerator see what they would under it).
`hora.environment.current()` reads them back.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from hora.environment import ELASTIC_VAR, RUN_ID_VAR
from hora.environment.gpus import visible_gpus
from hora.placement import RankPlacement, placements

# Tells torch.distributed that the launcher hosts the TCPStore at MASTER_ADDR:MASTER_PORT and every
# rank, rank 0 included, connects to it as a client. The launcher binds that port itself and keeps
# it, so no rank ever races to bind a port somebody else might take.
AGENT_STORE_VARS = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0"}

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


def run_env(run_id: str, elastic: bool) -> dict[str, str]:
    """The run's id (every attempt's), and whether it is elastic. The id is torchrun's too:
    TORCHELASTIC_RUN_ID is how frameworks tell a torchrun-style launch
    (`torch.distributed.is_torchelastic_launched()`: Lightning and Fabric then read RANK and
    WORLD_SIZE instead of deriving ranks from devices x num_nodes). An elastic run's ranks also
    get Horovod's HOROVOD_ELASTIC=1, as horovodrun's do: a DistributedOptimizer made in a world
    of one still reduces, so it works on once the world grows in place."""
    ids = {RUN_ID_VAR: run_id, "TORCHELASTIC_RUN_ID": run_id}
    return ids | ({ELASTIC_VAR: "1", "HOROVOD_ELASTIC": "1"} if elastic else {})


def driver_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The DRIVER_VARS set in the driver's environment, to pass to every worker."""
    env = os.environ if environ is None else environ
    return {name: env[name] for name in DRIVER_VARS if env.get(name)}


def driver_sys_path() -> list[str]:
    """The driver's import path, for the workers: modules it can import (a notebook's
    sys.path.append too) unpickle in them; '' (the current folder) made absolute. On a cluster,
    entries missing on the worker's host are harmless."""
    return [os.path.abspath(p) if p == "" else p for p in sys.path]


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
