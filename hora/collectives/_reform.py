"""A world re-formed in place: the survivors of a lost rank become a smaller world, in the same
processes (Horovod's elastic reset after a lost host).

The driver renumbers the survivors and tells each its new coordinates (`Reform`). Here a
survivor stops its engine, writes the new coordinates into its environment (where `init()` and
the user's code read them), makes a new default group through the launcher's store under a
prefix of its own (the old world's keys stay in the store, and must not be read again), and
starts the engine anew: new process groups, negotiation star and shared memory.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from hora import environment
from hora.collectives._basics import init, replace_default_group, shutdown, timeout
from hora.wire.protocol import Reform


def reform(order: Reform) -> None:
    """Make this process rank `order.rank` of a world of `order.size`, in place."""
    shutdown()
    placement = environment.RankPlacement(
        order.rank,
        order.size,
        order.local_rank,
        order.local_size,
        order.cross_rank,
        order.cross_size,
    )
    os.environ.update(environment.placement_env(placement))
    here = environment.current()
    addr, port = here.master_addr, here.master_port
    if not addr or port is None:
        raise RuntimeError("a world re-formed in place needs the launcher's MASTER_ADDR/PORT")
    wait = timeout()

    def make() -> None:
        client = dist.TCPStore(addr, port, is_master=False, timeout=wait)
        store = dist.PrefixStore(f"hora/reform/{order.generation}/", client)
        backend = "gloo"
        if torch.cuda.is_available() and dist.is_nccl_available():
            backend = "cpu:gloo,cuda:nccl"
        dist.init_process_group(
            backend, store=store, rank=order.rank, world_size=order.size, timeout=wait
        )

    replace_default_group(make)
    init()
