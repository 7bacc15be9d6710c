"""Allreduce among the ranks of one host through shared memory instead of gloo's TCP loopback.

gloo moves a same-host allreduce through loopback TCP: on a 2-core host 1 MB takes about 2 ms.
Here every rank copies its chunk into its own slot of one shared segment, the ranks meet at a
barrier (one byte to and from each peer over authenticated Unix sockets), and every rank reduces
all slots itself, in rank order, so that every rank gets bitwise the same result. The segment has
two halves used in turn: a rank writes half h again only after the next barrier, which every
peer enters only once it has finished reading h. Buffers larger than a slot go through in chunks.

Used for CPU tensors of the global process set when every rank is on this host (a single
machine, or `local[N]`-style runs); anything else, and `HORA_SHM=0`, keeps gloo. The segment is
unlinked as soon as every rank has mapped it, so a killed job leaves nothing in /dev/shm.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _unflatten_dense_tensors

from hora.collectives._common import Average, Max, Min, Product, Sum
from hora.wire import channel as wire

SLOT_BYTES = 4 << 20  # per rank and half: 2 ranks map 16 MB in all
MAX_LAYOUTS = 64  # bucket layouts whose slot views are kept, per half
MESH_TIMEOUT_S = 10.0  # for connecting: every rank is alive (they just met in a gloo collective)
_RANK = struct.Struct("!I")
_REDUCE: dict[int, Callable[..., torch.Tensor]] = {
    Sum: torch.add,
    Average: torch.add,
    Min: torch.minimum,
    Max: torch.maximum,
    Product: torch.mul,
}


class LocalReducer:
    """The shared segment and the barrier sockets of one set of same-host ranks."""

    def __init__(self, segment: mmap.mmap, index: int, size: int, peers: list[socket.socket]):
        self._segment = segment
        self._bytes = torch.frombuffer(segment, dtype=torch.uint8)
        self._index = index
        self._size = size
        self._peers = peers  # one socket per other rank, in rank order
        self._chunks = 0  # chunks reduced so far: which half the next one uses
        # (half, layout) -> views of this rank's slot shaped like a bucket's tensors
        self._views: dict[tuple[int, Any], list[torch.Tensor]] = {}

    def _slot(self, half: int, rank: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
        start = (half * self._size + rank) * SLOT_BYTES
        return self._bytes[start : start + numel * dtype.itemsize].view(dtype)

    def _barrier(self) -> None:
        for peer in self._peers:
            peer.sendall(b"\1")
        for peer in self._peers:
            if not peer.recv(1):
                raise ConnectionError("a same-host peer closed its shared-memory barrier")

    def allreduce_(self, work: torch.Tensor, op: int) -> None:
        """Reduce the contiguous `work` across the ranks, in place."""
        reduce = _REDUCE[op]
        flat = work.view(-1)
        step = SLOT_BYTES // flat.element_size()
        for start in range(0, flat.numel(), step):
            piece = flat[start : start + step]
            half = self._chunks % 2
            self._chunks += 1
            n = piece.numel()
            self._slot(half, self._index, piece.dtype, n).copy_(piece)
            self._barrier()
            slots = [self._slot(half, r, piece.dtype, n) for r in range(self._size)]
            reduce(slots[0], slots[1], out=piece)
            for other in slots[2:]:
                reduce(piece, other, out=piece)

    def fits(self, nbytes: int) -> bool:
        return nbytes <= SLOT_BYTES

    def allreduce_from_(
        self, tensors: list[torch.Tensor], layout: Any, out: torch.Tensor, op: int
    ) -> None:
        """Reduce `tensors` (one dtype, `fits` their bytes) into the flat `out`: they are
        copied straight into this rank's slot (views made once per layout and half), which
        saves the copy into a fusion buffer and from there into the slot."""
        half = self._chunks % 2
        self._chunks += 1
        dtype, n = out.dtype, out.numel()
        views = self._views.get((half, layout))
        if views is None:
            if len(self._views) >= 2 * MAX_LAYOUTS:
                self._views.clear()
            mine = self._slot(half, self._index, dtype, n)
            views = self._views[(half, layout)] = list(_unflatten_dense_tensors(mine, tensors))
        torch._foreach_copy_(views, tensors)
        self._barrier()
        reduce = _REDUCE[op]
        slots = [self._slot(half, r, dtype, n) for r in range(self._size)]
        reduce(slots[0], slots[1], out=out)
        for other in slots[2:]:
            reduce(out, other, out=out)

    def close(self) -> None:
        for peer in self._peers:
            peer.close()
        self._bytes = None  # type: ignore[assignment]  # release the export before closing
        with contextlib.suppress(BufferError):
            self._segment.close()


def _socket_name(token: bytes, rank: int) -> str:
    return f"\0hora-shm-{token.hex()}-{rank}"  # Linux abstract namespace: no file to clean up


def _map(path: str, nbytes: int) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


def connect(  # noqa: C901 - three all-rank agreements (file, mapping, mesh), each undoing the last
    rank: int, size: int, one_host: bool, token: bytes, key: bytes, world: Any, timeout: float
) -> LocalReducer | None:
    """Set up the reducer; every rank calls it, and all agree on a reducer or on None (gloo)."""
    nbytes = 2 * size * SLOT_BYTES
    path = f"/dev/shm/hora-{token.hex()}"
    listener: socket.socket | None = None
    segment: mmap.mmap | None = None
    ok = (
        one_host
        and os.environ.get("HORA_SHM", "1") != "0"
        and hasattr(socket, "AF_UNIX")
        and hasattr(os, "posix_fallocate")
    )
    try:
        if ok and rank == 0:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                # Reserve the pages now: a small /dev/shm (a container's 64 MB) must fail here,
                # not with SIGBUS at the first write beyond what tmpfs can hold.
                os.posix_fallocate(fd, 0, nbytes)
            finally:
                os.close(fd)
        if ok:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(_socket_name(token, rank))
            listener.listen(size)
    except OSError:
        ok = False
    flags: list[Any] = [None] * size
    dist.all_gather_object(flags, ok, group=world)  # rank 0's file exists once this returns
    try:
        if all(flags):
            try:
                segment = _map(path, nbytes)
            except OSError:
                ok = False
        dist.all_gather_object(flags, ok, group=world)  # every rank has mapped it, or not
    finally:
        if rank == 0:
            with contextlib.suppress(OSError):
                os.unlink(path)
    if not all(flags):
        if listener is not None:
            listener.close()
        if segment is not None:
            segment.close()
        return None
    assert listener is not None and segment is not None
    peers: list[socket.socket] = []
    try:
        peers = _mesh(rank, size, token, key, listener, min(timeout, MESH_TIMEOUT_S))
    except OSError:
        ok = False  # e.g. ranks in separate network namespaces: the sockets can't meet
    finally:
        listener.close()
    dist.all_gather_object(flags, ok, group=world)
    if not all(flags):
        for peer in peers:
            peer.close()
        segment.close()
        return None
    for peer in peers:
        peer.settimeout(timeout)  # a barrier waits as long as a gloo collective would
    return LocalReducer(segment, rank, size, peers)


def _mesh(
    rank: int, size: int, token: bytes, key: bytes, listener: socket.socket, timeout: float
) -> list[socket.socket]:
    """Connect every pair of ranks: each connects to the lower ranks, then accepts the higher."""
    by_rank: dict[int, socket.socket] = {}
    try:
        for lower in range(rank):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            by_rank[lower] = sock
            sock.settimeout(timeout)
            sock.connect(_socket_name(token, lower))
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
