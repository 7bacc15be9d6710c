"""Setting up a host's shared-memory reducer (`shm.LocalReducer`): the segment in /dev/shm, the
mesh of authenticated Unix sockets its barriers use, and every rank of the world agreeing on a
reducer on every host or on none (gloo then serves).

The segment is unlinked as soon as every rank has mapped it, so a killed job leaves nothing in
/dev/shm.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
import struct
from typing import Any

import torch.distributed as dist

from hora.collectives._data.shm import SLOT_BYTES, LocalReducer
from hora.wire import channel as wire

MESH_TIMEOUT_S = 10.0  # for connecting: every rank is alive (they just met in a gloo collective)
_RANK = struct.Struct("!I")


def _socket_name(token: bytes, host: int, index: int) -> str:
    return f"\0hora-shm-{token.hex()}-{host}-{index}"  # Linux abstract namespace: no file


def _map(path: str, nbytes: int) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


def connect(  # noqa: C901 - three all-rank agreements (file, mapping, mesh), each undoing the last
    index: int,
    size: int,
    host: int,
    token: bytes,
    key: bytes,
    world: Any,
    timeout: float,
) -> LocalReducer | None:
    """Set up the reducer of this host's ranks (`index` of `size` on host number `host`).

    Every rank of the world calls it, each host's ranks making their own segment, and all agree
    on a reducer on every host or on None (gloo). A host of one rank needs no segment.
    """
    nbytes = 2 * size * SLOT_BYTES
    path = f"/dev/shm/hora-{token.hex()}-{host}"
    listener: socket.socket | None = None
    segment: mmap.mmap | None = None
    shared = size > 1
    ok = (
        os.environ.get("HORA_SHM", "1") != "0"
        and hasattr(socket, "AF_UNIX")
        and hasattr(os, "posix_fallocate")
    )
    try:
        if ok and shared and index == 0:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                # Reserve the pages now: a small /dev/shm (a container's 64 MB) must fail here,
                # not with SIGBUS at the first write beyond what tmpfs can hold.
                os.posix_fallocate(fd, 0, nbytes)
            finally:
                os.close(fd)
        if ok and shared:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(_socket_name(token, host, index))
            listener.listen(size)
    except OSError:
        ok = False
    flags: list[Any] = [None] * dist.get_world_size(world)
    try:  # a rank lost in either agreement must not leave the file behind
        dist.all_gather_object(flags, ok, group=world)  # each host's file exists once it returns
        if all(flags) and shared:
            try:
                segment = _map(path, nbytes)
            except OSError:
                ok = False
        dist.all_gather_object(flags, ok, group=world)  # every rank has mapped it, or not
    finally:
        if index == 0 and shared:
            with contextlib.suppress(OSError):
                os.unlink(path)
    if not all(flags):
        if listener is not None:
            listener.close()
        if segment is not None:
            segment.close()
        return None
    peers: list[socket.socket] = []
    if shared:
        assert listener is not None and segment is not None
        try:
            peers = _mesh(index, size, token, host, key, listener, min(timeout, MESH_TIMEOUT_S))
        except OSError:
            ok = False  # e.g. ranks in separate network namespaces: the sockets can't meet
        finally:
            listener.close()
    dist.all_gather_object(flags, ok, group=world)
    if not all(flags):
        for peer in peers:
            peer.close()
        if segment is not None:
            segment.close()
        return None
    for peer in peers:
        peer.settimeout(timeout)  # a barrier waits as long as a gloo collective would
    return LocalReducer(segment, index, size, peers)


def _mesh(
    rank: int,
    size: int,
    token: bytes,
    host: int,
    key: bytes,
    listener: socket.socket,
    timeout: float,
) -> list[socket.socket]:
    """Connect every pair of ranks: each connects to the lower ranks, then accepts the higher."""
    by_rank: dict[int, socket.socket] = {}
    try:
        for lower in range(rank):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            by_rank[lower] = sock
            sock.settimeout(timeout)
            sock.connect(_socket_name(token, host, lower))
            wire.authenticate_as_client(sock, key)
            sock.sendall(_RANK.pack(rank))
        listener.settimeout(timeout)
        while len(by_rank) < size - 1:
            sock, _ = listener.accept()
            sock.settimeout(timeout)
            try:
                wire.authenticate_as_server(sock, key)
                (higher,) = _RANK.unpack(sock.recv(_RANK.size, socket.MSG_WAITALL))
            except (OSError, struct.error):
                sock.close()  # not one of ours: the real ranks still get in
                continue
            by_rank[higher] = sock
    except BaseException:
        for sock in by_rank.values():
            sock.close()
        raise
    return [by_rank[r] for r in sorted(by_rank)]
