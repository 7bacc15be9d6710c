"""The authenticated channel that carries payloads, logs and results between driver and workers.

Both sides prove they hold the run's secret (HMAC-SHA256 challenge-response, each way) before a
single frame is unpickled; until then frames are capped at a few bytes. After that, frames are
length-prefixed pickles. The channel authenticates peers; it does not encrypt.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import pickle
import queue
import socket
import struct
import threading
from typing import Any

_HEADER = struct.Struct("!Q")
_NONCE = 32
_HANDSHAKE_FRAME = 2 * _NONCE
_HANDSHAKE_TIMEOUT = 30.0


class ChannelClosed(ConnectionError):
    """The peer went away."""


class AuthenticationFailed(ConnectionError):
    """The peer does not hold the run's secret."""


def new_secret() -> bytes:
    return os.urandom(32)


def _mac(secret: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, role + nonce, hashlib.sha256).digest()


class Connection:
    """One authenticated socket. `send` is thread-safe (user threads may call log_to_driver)."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._send_lock = threading.Lock()
        self.peer: Any = None  # set by the owner (for example the rank on the other end)

    def _send_bytes(self, data: bytes) -> None:
        with self._send_lock:
            self._sock.sendall(_HEADER.pack(len(data)))
            self._sock.sendall(data)

    def _recv_bytes(self, limit: int | None = None) -> bytes:
        (size,) = _HEADER.unpack(self._recv_exact(_HEADER.size))
        if limit is not None and size > limit:
            raise AuthenticationFailed(f"oversized frame ({size} bytes) during the handshake")
        return self._recv_exact(size)

    def _recv_exact(self, size: int) -> bytes:
        buf = bytearray(size)
        view = memoryview(buf)
        got = 0
        while got < size:
            n = self._sock.recv_into(view[got:], size - got)
            if n == 0:
                raise ChannelClosed("the peer closed the connection")
            got += n
        return bytes(buf)

    def send(self, message: Any) -> None:
        self._send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def recv(self) -> Any:
        return pickle.loads(self._recv_bytes())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    # Handshake: the server challenges first; then the client challenges the server.
    def authenticate_as_server(self, secret: bytes) -> None:
        nonce = os.urandom(_NONCE)
        self._send_bytes(nonce)
        reply = self._recv_bytes(limit=_HANDSHAKE_FRAME)
        their_mac, their_nonce = reply[:_NONCE], reply[_NONCE:]
        if len(their_nonce) != _NONCE or not hmac.compare_digest(
            their_mac, _mac(secret, b"client", nonce)
        ):
            raise AuthenticationFailed("a peer failed to prove it holds the run's secret")
        self._send_bytes(_mac(secret, b"server", their_nonce))

    def authenticate_as_client(self, secret: bytes) -> None:
        challenge = self._recv_bytes(limit=_NONCE)
        nonce = os.urandom(_NONCE)
        self._send_bytes(_mac(secret, b"client", challenge) + nonce)
        answer = self._recv_bytes(limit=_NONCE)
        if not hmac.compare_digest(answer, _mac(secret, b"server", nonce)):
            raise AuthenticationFailed("the driver failed to prove it holds the run's secret")


def connect(address: tuple[str, int], secret: bytes, timeout: float = 60.0) -> Connection:
    """Connect to a driver's `Server` and authenticate both ways."""
    sock = socket.create_connection(address, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = Connection(sock)
    try:
        conn.authenticate_as_client(secret)
    except BaseException:
        conn.close()
        raise
    sock.settimeout(None)
    return conn


class Server:
    """Accepts authenticated connections and puts `(connection, message)` pairs on `inbox`.

    A closed connection is reported as `(connection, None)`. Every thread it starts is joined by
    `close()`, so a notebook running a hundred jobs leaks no threads, sockets or ports.
    """

    def __init__(self, secret: bytes, inbox: queue.Queue, host: str = "127.0.0.1"):
        self._secret = secret
        self._inbox = inbox
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
            conn = Connection(sock)
            with self._lock:
                if self._closed.is_set():
                    conn.close()
                    return
                self._connections.append(conn)
            self._start(self._serve, "hora-channel", conn, sock)

    def _serve(self, conn: Connection, sock: socket.socket) -> None:
        try:
            sock.settimeout(_HANDSHAKE_TIMEOUT)
            conn.authenticate_as_server(self._secret)
            sock.settimeout(None)
        except (OSError, AuthenticationFailed, struct.error):
            conn.close()  # never reported: an unauthenticated peer gets nothing and says nothing
            return
        try:
            while True:
                self._inbox.put((conn, conn.recv()))
        except Exception:  # closed, reset or garbled: the connection is over either way
            pass
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
