"""The one way hora's processes talk over TCP: framed, authenticated, allow-listed pickles.

Two stars use it: the driver's job channel (driver <-> supervisors and workers: `Server`,
`connect`, `Connection`) and the collectives' negotiation star (rank 0 <-> the other
ranks, which keeps only its topology in hora.collectives and frames with `send_frame` /
`recv_frame` here).

Both sides prove they hold a shared secret (HMAC-SHA256 challenge-response, each way) before a
single frame is unpickled; until then frames are capped at a few bytes. After that, frames are
length-prefixed pickles, unpickled by a restricted unpickler that resolves only the classes a
star's messages are made of (defence in depth: an authenticated peer still cannot name
`os.system`). The channel authenticates; it does not encrypt.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import io
import os
import pickle
import queue
import socket
import struct
import threading
from collections.abc import Collection
from typing import Any

_HEADER = struct.Struct("!Q")
_NONCE = 32
_HANDSHAKE_FRAME = 2 * _NONCE
_HANDSHAKE_TIMEOUT = 30.0
# Below this a frame goes out in one sendall (header + payload: one segment, one syscall); above
# it, two calls spare a copy of a large payload.
_JOIN_BELOW = 64 * 1024

#: a class a frame may name: (module, qualified name)
AllowedClass = tuple[str, str]


class ChannelClosed(ConnectionError):
    """The peer went away."""


class AuthenticationFailed(ConnectionError):
    """The peer does not hold the shared secret."""


class ForbiddenFrame(pickle.UnpicklingError):
    """A frame named a class outside its star's messages."""


def new_secret() -> bytes:
    return os.urandom(32)


def derived_key(secret: bytes, purpose: bytes) -> bytes:
    """HMAC(secret, purpose): a key for one purpose, so the run's secret itself never leaves the
    processes that hold it (nor enters an environment)."""
    return hmac.new(secret, purpose, hashlib.sha256).digest()


def allowed_classes(*classes: type) -> frozenset[AllowedClass]:
    """The allow-list entries of `classes` (a star lists its own message types)."""
    return frozenset((cls.__module__, cls.__qualname__) for cls in classes)


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, allowed: Collection[AllowedClass]):
        super().__init__(io.BytesIO(data))
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._allowed:
            return super().find_class(module, name)
        raise ForbiddenFrame(f"forbidden global {module}.{name} in a frame")


def loads(payload: bytes, allowed: Collection[AllowedClass]) -> Any:
    """Unpickle a frame, refusing any global that is not in `allowed`."""
    return _Unpickler(payload, allowed).load()


def pack(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


# -- framing ------------------------------------------------------------------------------------
def send_frame(sock: socket.socket, payload: bytes) -> None:
    """One length-prefixed frame (not thread-safe: a `Connection` serialises its senders)."""
    if len(payload) < _JOIN_BELOW:
        sock.sendall(_HEADER.pack(len(payload)) + payload)
    else:
        sock.sendall(_HEADER.pack(len(payload)))
        sock.sendall(payload)


def recv_exact(sock: socket.socket, size: int) -> bytes:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise ChannelClosed("the peer closed the connection")
        got += n
    return bytes(buf)


def recv_frame(sock: socket.socket, limit: int | None = None) -> bytes:
    """One frame's payload; a frame over `limit` bytes (during a handshake) is refused unread."""
    (size,) = _HEADER.unpack(recv_exact(sock, _HEADER.size))
    if limit is not None and size > limit:
        raise AuthenticationFailed(f"oversized frame ({size} bytes) during the handshake")
    return recv_exact(sock, size)


# -- handshake: the server challenges first; then the client challenges the server -------------
def _mac(secret: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, role + nonce, hashlib.sha256).digest()


def authenticate_as_server(sock: socket.socket, secret: bytes) -> None:
    nonce = os.urandom(_NONCE)
    send_frame(sock, nonce)
    reply = recv_frame(sock, limit=_HANDSHAKE_FRAME)
    their_mac, their_nonce = reply[:_NONCE], reply[_NONCE:]
    if len(their_nonce) != _NONCE or not hmac.compare_digest(
        their_mac, _mac(secret, b"client", nonce)
    ):
        raise AuthenticationFailed("a peer failed to prove it holds the shared secret")
    send_frame(sock, _mac(secret, b"server", their_nonce))


def authenticate_as_client(sock: socket.socket, secret: bytes, server: str = "the server") -> None:
    """`server` names the other end in the error (a user reads "the driver failed to prove")."""
    challenge = recv_frame(sock, limit=_NONCE)
    nonce = os.urandom(_NONCE)
    send_frame(sock, _mac(secret, b"client", challenge) + nonce)
    answer = recv_frame(sock, limit=_NONCE)
    if not hmac.compare_digest(answer, _mac(secret, b"server", nonce)):
        raise AuthenticationFailed(f"{server} failed to prove it holds the shared secret")


# -- the driver's star --------------------------------------------------------------------------
class Connection:
    """One authenticated socket of the job channel. `send` is thread-safe (user threads may call
    log_to_driver); `recv` unpickles only the classes in `allowed`."""

    def __init__(self, sock: socket.socket, allowed: Collection[AllowedClass]):
        self._sock = sock
        self._allowed = allowed
        self._send_lock = threading.Lock()
        self.peer: Any = None  # set by the owner (for example the rank on the other end)

    def send(self, message: Any) -> None:
        payload = pack(message)
        with self._send_lock:
            send_frame(self._sock, payload)

    def recv(self) -> Any:
        return loads(recv_frame(self._sock), self._allowed)

    @property
    def local_host(self) -> str:
        """This end's address: the interface of this machine that reaches the other end."""
        return str(self._sock.getsockname()[0])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def connect(
    address: tuple[str, int],
    secret: bytes,
    allowed: Collection[AllowedClass],
    timeout: float = 60.0,
) -> Connection:
    """Connect to a driver's `Server` and authenticate both ways."""
    sock = socket.create_connection(address, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        authenticate_as_client(sock, secret, server="the driver")
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    return Connection(sock, allowed)


class Server:
    """Accepts authenticated connections and puts `(connection, message)` pairs on `inbox`.

    A closed connection is reported as `(connection, None)`. Every thread it starts is joined by
    `close()`, so a notebook running a hundred jobs leaks no threads, sockets or ports.
    """

    def __init__(
        self,
        secret: bytes,
        inbox: queue.Queue,
        allowed: Collection[AllowedClass],
        host: str = "127.0.0.1",
    ):
        self._secret = secret
        self._inbox = inbox
        self._allowed = allowed
        self._listener = socket.create_server((host, 0), backlog=128)
        self._listener.settimeout(0.5)
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._connections: list[Connection] = []
        self._threads: list[threading.Thread] = []
        self._start(self._accept_loop, "hora-accept")

    def _start(self, target: Any, name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Connection(sock, self._allowed)
            with self._lock:
                if self._closed.is_set():
                    conn.close()
                    return
                self._connections.append(conn)
            self._start(self._serve, "hora-channel", conn, sock)

    def _serve(self, conn: Connection, sock: socket.socket) -> None:
        try:
            sock.settimeout(_HANDSHAKE_TIMEOUT)
            authenticate_as_server(sock, self._secret)
            sock.settimeout(None)
        except (OSError, AuthenticationFailed, struct.error):
            conn.close()  # never reported: an unauthenticated peer gets nothing and says nothing
            return
        try:
            while True:
                self._inbox.put((conn, conn.recv()))
        except Exception:  # closed, reset, garbled or forbidden: the connection is over
            pass
        conn.close()  # a peer that sent a forbidden frame hears nothing more either
        self._inbox.put((conn, None))

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            connections, threads = list(self._connections), list(self._threads)
        for conn in connections:
            conn.close()
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5)
