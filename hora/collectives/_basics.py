"""Process basics: init/shutdown, ranks and sizes, capability probes.

`init()` reads whichever launcher started the process (hora, horovodrun, torchrun,
TorchDistributor), reuses torch.distributed when the user already initialised it, and otherwise
initialises it from the environment; with no launcher at all it is a world of one.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hora import environment, timeline
from hora.collectives import _rendezvous
from hora.collectives._common import NOT_INITIALIZED
from hora.collectives._control import state as _state
from hora.collectives._control.process_sets import ProcessSet, global_process_set, register
from hora.collectives._data.groups import GroupInfo, destroy_groups, make_groups
from hora.collectives._messages import ProcessSetChange
from hora.collectives._start import env_float, start_loop
from hora.collectives.ops import barrier
from hora.placement import RankPlacement, placements

_atexit_registered = False
_created_default_group = False


def timeout() -> timedelta:
    """How long a transport or the negotiation channel waits for a silent peer."""
    return timedelta(seconds=env_float("HOROVOD_GLOO_TIMEOUT_SECONDS", 30.0))


def _init_torch_distributed() -> bool:
    """Initialise the default group from the launcher's environment; False when there is none."""
    here = environment.current()
    rank, size = here.rank, here.size
    if size is None or rank is None:
        return False
    if not here.master_addr or here.master_port is None:
        if size == 1:
            return False
        raise ValueError(
            "hora.torch.init(): RANK/WORLD_SIZE are set but MASTER_ADDR/MASTER_PORT are not; "
            "start the processes with hora, torchrun or TorchDistributor"
        )
    _rendezvous.init_default_group(here, timeout())  # a new rank of a world grown in place too
    return True


def _placement(rank: int, size: int, world: Any) -> RankPlacement:
    """This rank's coordinates: the launcher's, else worked out from the ranks' host names."""
    given = environment.current().placement
    if given is not None:
        return given._replace(rank=rank, size=size)
    if size == 1:
        return RankPlacement(rank, size, 0, 1, 0, 1)
    hosts: list[Any] = [None] * size
    dist.all_gather_object(hosts, socket.gethostname(), group=world)
    return placements([str(h) for h in hosts])[rank]


def init(
    comm: Sequence[int] | None = None,
    process_sets: Sequence[ProcessSet] | str | None = None,
) -> None:
    """Start hora.torch on this process: every rank calls it; a second call does nothing.

    After a failure stopped the loop (an error on some rank's loop thread, a lost peer),
    every op raises HorovodInternalError until the next `init()`, which starts a fresh world as
    `shutdown()` then `init()` would: the next test of a suite begins from a working world.
    After a peer's own `shutdown()` it stays a no-op, as in Horovod (call `shutdown()` first).
    """
    global _atexit_registered, _created_default_group
    if _state.current is not None:
        if not _state.current.loop.broken:
            return
        shutdown()
    if dist.is_initialized():
        rank, size = dist.get_rank(), dist.get_world_size()
    elif _init_torch_distributed():
        _created_default_group = True
        rank, size = dist.get_rank(), dist.get_world_size()
    else:
        rank, size = 0, 1
    if comm is not None and sorted(int(r) for r in comm) != list(range(size)):
        raise NotImplementedError(
            "hora.torch.init(comm=...) supports only the whole world; use a ProcessSet for a "
            "subset of ranks"
        )
    wait = timeout()
    world = make_world(rank, size, wait)
    place = _placement(rank, size, world.gloo)
    groups: dict[int, GroupInfo] = {0: world}
    loop = start_loop(place, groups, wait)
    dynamic = process_sets == "dynamic" or os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS") in (
        "1",
        "true",
        "True",
    )
    _state.current = _state.State(
        place=place,
        loop=loop,
        groups=groups,
        dynamic=dynamic,
    )
    _state.current.process_sets[0] = global_process_set
    global_process_set.ranks = list(range(size))
    if process_sets is not None and not isinstance(process_sets, str):
        for ps in process_sets:
            register(ps, wait)
        if process_sets:
            barrier_all()
    if not _atexit_registered:
        atexit.register(_at_exit)
        _atexit_registered = True
    timeline.on_init(rank, size, world.gloo)  # HOROVOD_TIMELINE: start recording


def owns_default_group() -> bool:
    """Whether hora made torch.distributed's default group (so it may make it again)."""
    return _created_default_group and dist.is_initialized()


def replace_default_group(make: Any) -> None:
    """Destroy hora's default group and make the next with `make()` (a world re-formed)."""
    global _created_default_group
    if owns_default_group():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    make()
    _created_default_group = True


def make_world(rank: int, size: int, wait: timedelta) -> GroupInfo:
    """hora's own groups over the world: never the user's default group (its order is theirs)."""
    if size == 1:
        return GroupInfo(ranks=(0,), index=0)
    return make_groups(list(range(size)), rank, wait)


def barrier_all() -> None:
    """A barrier through the loop (so it is ordered after any control message)."""
    barrier()


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a new process set at run time (dynamic mode); every rank must call it."""
    state = _state.get()
    if not state.dynamic:
        raise ValueError(
            "Dynamic process sets are not enabled: call hvd.init(process_sets='dynamic') "
            "or set HOROVOD_DYNAMIC_PROCESS_SETS=1"
        )
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    register(ps, timeout())
    barrier_all()  # every rank's coordinator knows the set before anyone uses it
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set (every rank calls it); False if it was not registered."""
    state = _state.get()
    ps_id = process_set.process_set_id
    if ps_id is None or ps_id == 0 or state.process_sets.get(ps_id) is not process_set:
        return False
    barrier_all()  # nobody still has an operation of the set in flight
    info = state.groups.pop(ps_id)
    del state.process_sets[ps_id]
    state.loop.control(ProcessSetChange(ps_id, None))
    destroy_groups(info)
    process_set.process_set_id = None
    return True


def shutdown() -> None:
    """Stop the loop and release hora's groups; `init()` may be called again afterwards."""
    state = _state.current
    if state is None:
        return
    _state.current = None
    timeline.on_shutdown()  # write the timeline's last events
    state.loop.stop(timeout().total_seconds())
    for ps in state.process_sets.values():
        if ps is not global_process_set:
            ps.process_set_id = None
    if not state.loop._thread.is_alive():  # never pull groups from under a stuck thread
        for info in state.groups.values():
            destroy_groups(info)


def _at_exit() -> None:
    global _created_default_group
    shutdown()
    if _created_default_group and dist.is_initialized():
        _created_default_group = False
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def is_initialized() -> bool:
    return _state.current is not None


def size() -> int:
    """Number of processes in the world."""
    return _state.get().size


def rank() -> int:
    """This process's global rank."""
    return _state.get().rank


def local_size() -> int:
    """Number of processes on this host."""
    return _state.get().local_size


def local_rank() -> int:
    """This process's rank on its host (pin a GPU with it)."""
    return _state.get().local_rank


def cross_size() -> int:
    """Number of hosts."""
    return _state.get().cross_size


def cross_rank() -> int:
    """This host's index among the hosts."""
    return _state.get().cross_rank


def is_homogeneous() -> bool:
    """Whether every host runs the same number of processes."""
    state = _state.get()
    return state.local_size * state.cross_size == state.size


# ----- capability probes (what was built in, as Horovod reports it) ------------------------------
def mpi_enabled() -> bool:
    return False


def mpi_built() -> bool:
    return False


def mpi_threads_supported() -> bool:
    raise ValueError("Horovod MPI is not enabled: hora.torch runs on torch.distributed")


def gloo_enabled() -> bool:
    return bool(dist.is_available() and dist.is_gloo_available())


def gloo_built() -> bool:
    return gloo_enabled()


def nccl_built() -> int:
    """NCCL version code (e.g. 22105 for 2.21.5), 0 when torch has no NCCL."""
    if not (dist.is_available() and dist.is_nccl_available()):
        return 0
    try:
        major, minor, patch = torch.cuda.nccl.version()[:3]
    except Exception:
        return 0
    return int(major) * 10000 + int(minor) * 100 + int(patch)


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    return bool(torch.backends.cuda.is_built())


def rocm_built() -> bool:
    return torch.version.hip is not None


__all__ = [
    "NOT_INITIALIZED",
    "add_process_set",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "gloo_built",
    "gloo_enabled",
    "init",
    "is_homogeneous",
    "is_initialized",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rank",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
]
