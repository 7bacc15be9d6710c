"""The collective loop's start at `init()`: its thread, the negotiation tree that links it to
the other ranks' loops (with the key that authenticates it), and the world's data path beyond
gloo (shared memory on one host, the hierarchical path on several).
"""

from __future__ import annotations

import contextlib
import os
import socket
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from hora import environment
from hora.collectives import _driver, _rendezvous
from hora.collectives._control import channel
from hora.collectives._control.loop import CollectiveLoop, LoopConfig, TreeSockets
from hora.collectives._control.stall import StallSettings
from hora.collectives._control.tree import NegotiationTree, fanout_from_env
from hora.collectives._data import hierarchy, shm_setup
from hora.collectives._data.groups import GroupInfo
from hora.placement import RankPlacement

DEFAULT_FUSION_THRESHOLD = 128 * 1024 * 1024
DEFAULT_CYCLE_TIME_MS = 1.0


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


def start_loop(
    place: RankPlacement, groups: dict[int, GroupInfo], wait: timedelta
) -> CollectiveLoop:
    """The loop thread, its negotiation tree, and the world's data path beyond gloo: shared
    memory on one host, the hierarchical path on several, for the rank at `place`."""
    rank, size = place.rank, place.size
    world = groups[0]
    config = LoopConfig(
        rank=rank,
        size=size,
        cycle_time_s=env_float("HOROVOD_CYCLE_TIME", DEFAULT_CYCLE_TIME_MS) / 1000.0,
        fusion_threshold=int(env_float("HOROVOD_FUSION_THRESHOLD", DEFAULT_FUSION_THRESHOLD)),
        timeout_s=wait.total_seconds(),
        stall=StallSettings.from_env(),
        report_stall=_driver.report_stall,
    )
    if size == 1:
        return CollectiveLoop(config, groups, TreeSockets(NegotiationTree(1), None, {}))
    fanout = fanout_from_env()  # every rank checks its own; rank 0's is the one used
    token = channel.new_token()
    server = None
    address = ""
    mode = ""
    store = _default_store()
    if rank == 0:
        server, address = channel.listen(channel.local_address(_master_addr(store)))
        if _driver.attached():
            mode = "launcher"
        elif store is not None:
            mode = "store"
            store.set(_store_key(token), channel.new_key())
        else:  # pragma: no cover - torch.distributed always has a default store once initialised
            raise RuntimeError("hora.torch.init(): torch.distributed has no store to share a key")
        if store is None:  # pragma: no cover - no store for the parents' addresses: a star
            fanout = max(fanout, size - 1)
    box: list[Any] = [address, token, mode, fanout]
    dist.broadcast_object_list(box, src=0, group=world.gloo)
    address, token, mode, fanout = box
    key = channel.channel_key(_negotiation_key(mode, store, _store_key(token)), token)
    tree = NegotiationTree(size, fanout)
    try:
        sockets = _join_tree(tree, rank, server, address, token, key, store, config.timeout_s)
        loop = CollectiveLoop(config, groups, sockets)
        # Both set-ups gather from every rank, each of which has read the key by then.
        if place.local_size == size:  # one host
            world.local = shm_setup.connect(rank, size, 0, token, key, world.gloo, config.timeout_s)
        else:
            world.hierarchy = hierarchy.connect(place, token, key, world.gloo, wait)
    finally:
        if rank == 0 and mode == "store":
            with contextlib.suppress(Exception):
                store.delete_key(_store_key(token))
    return loop


def _store_key(token: bytes, rank: int | None = None) -> str:
    """Where this world's negotiation key (rank 0, store mode) or a parent's address lives."""
    base = f"hora.torch/negotiation/{token.hex()}"
    return base if rank is None else f"{base}/address/{rank}"


def _join_tree(
    tree: NegotiationTree,
    rank: int,
    server: socket.socket | None,
    root_address: str,
    token: bytes,
    key: bytes,
    store: Any,
    timeout_s: float,
) -> TreeSockets:
    """Connect to this rank's parent in the negotiation tree, then accept its children.

    Rank 0's address came with the broadcast; every other parent publishes its own in the
    store, where its children read it: one store operation a rank, whatever the world's size.
    A parent connects upwards before it accepts, so the tree forms from rank 0 down."""
    children = tree.children(rank)
    if children and server is None:
        server, address = channel.listen(channel.local_address(_master_addr(store)))
        store.set(_store_key(token, rank), address)
    parent = tree.parent(rank)
    up = None
    if parent is not None:
        where = root_address
        if parent != 0:
            published = _store_key(token, parent)
            store.wait([published], timedelta(seconds=timeout_s))
            where = store.get(published).decode()
        up = (parent, channel.connect(where, rank, key, timeout_s))
    down: dict[int, socket.socket] = {}
    if children:
        assert server is not None
        try:
            down = channel.accept_children(server, children, key, timeout_s, _give_way)
        finally:
            if rank != 0:
                with contextlib.suppress(Exception):
                    store.delete_key(_store_key(token, rank))
    return TreeSockets(tree, up, down)


def _give_way() -> None:
    """While a parent waits for its children: where the driver has ordered a newer world (a
    rank of this one was lost), raise, so that this rank re-forms that one now rather than at
    the timeout (`hora.collectives.elastic` re-forms on any error of a world's start)."""
    generation = environment.current().generation
    if generation:  # the first world: as ever
        _rendezvous.raise_if_superseded(generation)


def _default_store() -> Any:
    """torch.distributed's default store (the rendezvous TCPStore under env:// launchers)."""
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # pragma: no cover - private API moved
        return None


def _master_addr(store: Any) -> str | None:
    """The rendezvous host: MASTER_ADDR, else the default TCPStore's host."""
    addr = environment.current().master_addr
    if addr:
        return addr
    while store is not None and not hasattr(store, "host"):
        store = getattr(store, "underlying_store", None)
    return getattr(store, "host", None) if store is not None else None


def _negotiation_key(mode: str, store: Any, store_key: str) -> bytes:
    """The key every rank of this world authenticates the negotiation tree with.

    Under a hora launcher ("launcher"): derived from the run's channel secret, which the worker
    bootstrap read from stdin (`hora.wire.link.DriverLink.negotiation_key`); no key travels at
    all. Without one (torchrun, TorchDistributor, a user-initialised group: "store"): rank 0
    draws a random key and publishes it in torch.distributed's default store, the TCPStore every
    rank already rendezvoused through. That is exactly as trusted as torch.distributed's own
    rendezvous: whoever can read that store can also join the process group and feed gloo.
    Rank 0 deletes the key from the store once every rank has read it.
    """
    if mode == "launcher":
        key = _driver.negotiation_key()
        if key is None:
            raise RuntimeError(
                "hora.torch.init(): rank 0 runs under a hora launcher but this rank does not; "
                "start every rank the same way"
            )
        return key
    return bytes(store.get(store_key))
