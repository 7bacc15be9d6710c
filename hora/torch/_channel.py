"""The negotiation channel: a TCP star with rank 0 at its centre, apart from the data path.

gloo's small collectives cost about a millisecond each on a busy host, a socket round trip tens of
microseconds, so requests and responses travel on plain sockets: length-prefixed pickles. A dead
peer closes its socket, which every survivor sees at once (no idle polling is needed to notice).
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
from typing import Any

_HEADER = struct.Struct("!I")


def send_msg(sock: socket.socket, obj: Any) -> None:
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(payload)) + payload)


def send_payload(sock: socket.socket, payload: bytes) -> None:
    """Send an already pickled message (the coordinator pickles a response once for all ranks)."""
    sock.sendall(_HEADER.pack(len(payload)) + payload)


def pack(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("peer closed the negotiation channel")
        got += k
    return bytes(buf)


def recv_msg(sock: socket.socket) -> Any:
    (length,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    return pickle.loads(_recv_exact(sock, length))


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
    """Rank 0 listens on an ephemeral port of `host`; returns the socket and "host:port"."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind((host, 0))
    server.listen(128)
    return server, f"{host}:{server.getsockname()[1]}"


def accept_workers(
    server: socket.socket, workers: int, token: bytes, timeout: float
) -> dict[int, socket.socket]:
    """Accept one connection per other rank; each introduces itself with (token, rank)."""
    server.settimeout(timeout)
    peers: dict[int, socket.socket] = {}
    try:
        while len(peers) < workers:
            conn, _ = server.accept()
            _tune(conn, timeout)
            hello = recv_msg(conn)
            if not (isinstance(hello, tuple) and hello[0] == token):
                conn.close()
                continue
            peers[int(hello[1])] = conn
    finally:
        server.close()
    return peers


def connect(address: str, rank: int, token: bytes, timeout: float) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    _tune(sock, timeout)
    send_msg(sock, (token, rank))
    return sock


def new_token() -> bytes:
    return os.urandom(16)


def wake_pair() -> tuple[socket.socket, socket.socket]:
    """A socket pair the caller's thread writes to so that the engine's select() wakes up."""
    r, w = socket.socketpair()
    r.setblocking(False)
    w.setblocking(False)
    return r, w
