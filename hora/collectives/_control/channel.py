"""The negotiation channel: the sockets of the negotiation tree (`tree`), apart from the data path.

gloo's small collectives cost about a millisecond each on a busy host, a socket round trip tens of
microseconds, so requests and responses travel on plain sockets: length-prefixed pickles. A dead
peer closes its socket, which its parent and children see at once (no idle polling is needed to
notice). Every rank with children listens; each child connects to its parent.

Security: a parent listens on a TCP port, so anything that can reach it could otherwise feed it a
pickle. Every socket of the tree is therefore authenticated both ways (the HMAC-SHA256
challenge-response of `hora.wire.channel`, with a key every rank of this world holds, see
`hora.collectives._start._negotiation_key`) before a single frame is unpickled; a peer that
fails is closed unread. Frames (hora.wire.channel's framing) are then unpickled by a restricted
unpickler that resolves only the collective loop's own message classes (defence in depth). The
channel authenticates; it does not encrypt.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import socket
import struct
import time
from collections.abc import Callable, Collection
from typing import Any

from hora.collectives._messages import (
    Bucket,
    CacheDrop,
    Entry,
    Failure,
    Join,
    JoinDone,
    Request,
    Shutdown,
    Stop,
)
from hora.wire import channel as wire

log = logging.getLogger("hora.torch")

_HELLO = struct.Struct("!I")  # a worker's rank, sent raw once it is authenticated
HANDSHAKE_TIMEOUT_S = 10.0
GIVE_WAY_S = 0.1  # how often a parent waiting for its children asks whether to give way

# The only globals a negotiation frame may name: the loop's message classes. Everything else in
# a frame is built from pickle's own opcodes (str, int, float, tuple, list, dict, None, bool).
_ALLOWED_CLASSES = wire.allowed_classes(
    Request, Entry, Bucket, Failure, JoinDone, CacheDrop, Shutdown, Join, Stop
)
ForbiddenFrame = wire.ForbiddenFrame
pack = wire.pack


def loads(payload: bytes) -> Any:
    """Unpickle a negotiation frame, refusing any global but the loop's message classes."""
    return wire.loads(payload, _ALLOWED_CLASSES)


def send_msg(sock: socket.socket, obj: Any) -> None:
    wire.send_frame(sock, wire.pack(obj))


def send_payload(sock: socket.socket, payload: bytes) -> None:
    """Send an already pickled message (the coordinator pickles a response once for all ranks)."""
    wire.send_frame(sock, payload)


def recv_msg(sock: socket.socket) -> Any:
    return loads(wire.recv_frame(sock))


def recv_payload(sock: socket.socket) -> bytes:
    """One frame, still pickled (a parent's answer, passed on to the children as it came)."""
    return wire.recv_frame(sock)


def local_address(master_addr: str | None) -> str:
    """This host's address as seen from `master_addr` (no packet is sent: UDP connect only)."""
    if master_addr:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((master_addr, 9))
                return str(probe.getsockname()[0])
        except OSError:
            pass
    return socket.gethostbyname(socket.gethostname())


def _tune(sock: socket.socket, timeout: float) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.settimeout(timeout)


def listen(host: str) -> tuple[socket.socket, str]:
    """A parent listens on an ephemeral port of `host` only; returns the socket and "host:port"."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind((host, 0))
    server.listen(128)
    return server, f"{host}:{server.getsockname()[1]}"


def channel_key(base_key: bytes, token: bytes) -> bytes:
    """The key of one world's tree: the base key bound to this `init()`'s random token."""
    return hmac.new(base_key, b"hora.torch star " + token, hashlib.sha256).digest()


def accept_children(
    server: socket.socket,
    children: Collection[int],
    key: bytes,
    timeout: float,
    give_way: Callable[[], None] | None = None,
) -> dict[int, socket.socket]:
    """Accept one authenticated connection per rank of `children`, within `timeout` overall;
    `give_way` is called every `GIVE_WAY_S` while none comes, and may raise to stop waiting (a
    newer world ordered: a child lost before it connected never will).

    A connection that fails the handshake (wrong key, garbage, silence for
    `HANDSHAKE_TIMEOUT_S`), or names a rank that is not a child or is here already, is closed
    without anything it sent being unpickled, and does not take a rank's place; the real ranks
    still get in.
    """
    deadline = time.monotonic() + timeout
    peers: dict[int, socket.socket] = {}
    try:
        while len(peers) < len(children):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(children) - set(peers))
                raise TimeoutError(
                    f"only {len(peers)} of {len(children)} ranks reached the negotiation channel "
                    f"(missing: {_listed(missing)})"
                )
            server.settimeout(min(remaining, GIVE_WAY_S) if give_way else remaining)
            try:
                conn, addr = server.accept()
            except TimeoutError:
                if give_way is not None:
                    give_way()
                continue
            try:
                conn.settimeout(min(HANDSHAKE_TIMEOUT_S, remaining))
                wire.authenticate_as_server(conn, key)
                (rank,) = _HELLO.unpack(wire.recv_exact(conn, _HELLO.size))
                if rank not in children or rank in peers:
                    raise wire.AuthenticationFailed(f"unexpected rank {rank}")
            except (OSError, ConnectionError, struct.error) as exc:
                log.warning("hora.torch: refused a negotiation connection from %s: %s", addr, exc)
                conn.close()
                continue
            _tune(conn, timeout)
            peers[rank] = conn
    except BaseException:
        for conn in peers.values():
            conn.close()
        raise
    finally:
        server.close()
    return peers


def _listed(ranks: list[int], most: int = 16) -> str:
    shown = ", ".join(map(str, ranks[:most]))
    return f"ranks {shown}" + (f" and {len(ranks) - most} more" if len(ranks) > most else "")


def connect(address: str, rank: int, key: bytes, timeout: float) -> socket.socket:
    """Connect to this rank's parent in the tree and authenticate both ways before anything else
    is exchanged."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    try:
        sock.settimeout(max(timeout, HANDSHAKE_TIMEOUT_S))
        wire.authenticate_as_client(sock, key)
        sock.sendall(_HELLO.pack(rank))
    except BaseException:
        sock.close()
        raise
    _tune(sock, timeout)
    return sock


def new_token() -> bytes:
    return os.urandom(16)


def new_key() -> bytes:
    return os.urandom(32)


def wake_pair() -> tuple[socket.socket, socket.socket]:
    """A socket pair the caller's thread writes to so that the loop's select() wakes up."""
    r, w = socket.socketpair()
    r.setblocking(False)
    w.setblocking(False)
    return r, w
