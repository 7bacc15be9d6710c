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
import selectors
import socket
import struct
import threading
import time
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
    send_frame(sock, _server_answer(secret, nonce, recv_frame(sock, limit=_HANDSHAKE_FRAME)))


def _server_answer(secret: bytes, nonce: bytes, reply: bytes) -> bytes:
    """The server's proof, once the client's `reply` to the challenge `nonce` proved its own."""
    their_mac, their_nonce = reply[:_NONCE], reply[_NONCE:]
    if len(their_nonce) != _NONCE or not hmac.compare_digest(
        their_mac, _mac(secret, b"client", nonce)
    ):
        raise AuthenticationFailed("a peer failed to prove it holds the shared secret")
    return _mac(secret, b"server", their_nonce)


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
        #: `time.monotonic()` when a frame last came from the peer (a `Server` sets it), and
        #: when this end last sent one
        self.heard_at = self.sent_at = time.monotonic()
        #: a `Server`'s connection is closed by its reading thread, which hears the shutdown
        self._closed_by_reader = False

    def send(self, message: Any) -> None:
        payload = pack(message)
        with self._send_lock:
            send_frame(self._sock, payload)
            self.sent_at = time.monotonic()

    def recv(self) -> Any:
        return loads(recv_frame(self._sock), self._allowed)

    @property
    def local_host(self) -> str:
        """This end's address: the interface of this machine that reaches the other end."""
        return str(self._sock.getsockname()[0])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        if not self._closed_by_reader:
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


_BACKLOG = 4096  # a thousand ranks dial at once: a short queue would drop SYNs (1-3 s retries)
_READ = 1 << 16
_GATHER_SECONDS = 0.005  # after a wake-up, how long the frames that follow gather


class _Peer:
    """One accepted socket as the server's thread reads it: its bytes so far, and whether it
    has proved it holds the secret (until then, the nonce it was challenged with)."""

    def __init__(self, sock: socket.socket, allowed: Collection[AllowedClass], deadline: float):
        self.sock = sock
        self.conn = Connection(sock, allowed)
        self.conn._closed_by_reader = True
        self.buffer = bytearray()
        self.nonce: bytes | None = os.urandom(_NONCE)  # None once authenticated
        self.deadline = deadline


class Server:
    """Accepts authenticated connections and puts `(connection, message)` pairs on `inbox`.

    One thread serves every connection (a selector over the sockets): a thousand ranks cost one
    thread, not a thousand, and their frames are read a few milliseconds' worth at a time. A
    closed connection is reported as `(connection, None)`; a peer that fails the handshake is
    dropped unheard. Every frame sets its connection's `heard_at`; a message of a `quiet` type
    (a heartbeat) does nothing else. `close()` joins the thread, so a notebook running a
    hundred jobs leaks no threads, sockets or ports.
    """

    def __init__(
        self,
        secret: bytes,
        inbox: queue.Queue | queue.SimpleQueue,
        allowed: Collection[AllowedClass],
        host: str = "127.0.0.1",
        quiet: tuple[type, ...] = (),
    ):
        self._secret = secret
        self._inbox = inbox
        self._allowed = allowed
        self._quiet = quiet  # message types that only say the peer is there (`heard_at`)
        self._listener = socket.create_server((host, 0), backlog=_BACKLOG)
        self._listener.setblocking(False)
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._closed = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._wake_r)
        self._peers: dict[socket.socket, _Peer] = {}
        self._handshaking: dict[socket.socket, _Peer] = {}  # (their deadlines, looked at often)
        self._thread = threading.Thread(target=self._loop, name="hora-channel", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            while not self._closed.is_set():
                ready = self._selector.select(self._next_deadline())
                for key, _ in ready:
                    if key.data is None:
                        self._accept()
                    elif isinstance(key.data, _Peer):
                        self._read(key.data)
                if self._handshaking:
                    self._drop_slow_handshakes()
                elif ready:  # a thousand ranks' frames come in few wake-ups, not one each
                    time.sleep(_GATHER_SECONDS)
        finally:
            for peer in list(self._peers.values()):
                self._forget(peer)
            self._selector.close()
            self._listener.close()
            self._wake_r.close()
            self._wake_w.close()

    def _accept(self) -> None:
        deadline = time.monotonic() + _HANDSHAKE_TIMEOUT
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            sock.setblocking(True)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = _Peer(sock, self._allowed, deadline)
            try:
                send_frame(sock, peer.nonce or b"")  # the challenge: a fresh socket takes it whole
            except OSError:
                sock.close()
                continue
            self._peers[sock] = self._handshaking[sock] = peer
            self._selector.register(sock, selectors.EVENT_READ, peer)

    def _read(self, peer: _Peer) -> None:
        try:
            chunk = peer.sock.recv(_READ)
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(peer)
            return
        peer.buffer += chunk
        peer.conn.heard_at = time.monotonic()
        try:
            while (payload := _frame(peer.buffer, peer.nonce is not None)) is not None:
                if peer.nonce is not None:
                    self._answer(peer, payload)
                elif not isinstance(message := loads(payload, self._allowed), self._quiet):
                    self._inbox.put((peer.conn, message))
        except Exception:  # garbled, forbidden or unauthenticated: the connection is over
            self._drop(peer)

    def _answer(self, peer: _Peer, reply: bytes) -> None:
        """The client's answer to the challenge and its own; then it is one of the star's."""
        assert peer.nonce is not None
        send_frame(peer.sock, _server_answer(self._secret, peer.nonce, reply))
        peer.nonce = None
        del self._handshaking[peer.sock]

    def _drop(self, peer: _Peer) -> None:
        """The connection is over: said as `(connection, None)` once it had authenticated
        (a peer that sent a forbidden frame hears nothing more either)."""
        self._forget(peer)
        if peer.nonce is None and not self._closed.is_set():
            self._inbox.put((peer.conn, None))

    def _forget(self, peer: _Peer) -> None:
        self._peers.pop(peer.sock, None)
        self._handshaking.pop(peer.sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(peer.sock)
        with contextlib.suppress(OSError):
            peer.sock.shutdown(socket.SHUT_RDWR)
        peer.sock.close()

    def _next_deadline(self) -> float | None:
        """Until the first handshake under way runs out of time (None: none is)."""
        if not self._handshaking:
            return None
        return max(0.0, min(p.deadline for p in self._handshaking.values()) - time.monotonic())

    def _drop_slow_handshakes(self) -> None:
        now = time.monotonic()
        for peer in [p for p in self._handshaking.values() if p.deadline < now]:
            self._forget(peer)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


def _frame(buffer: bytearray, handshake: bool) -> bytes | None:
    """The first whole frame, taken off the front of `buffer` (None: not all here yet); during a
    handshake, a frame longer than its answer is refused unread."""
    if len(buffer) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack_from(buffer)
    if handshake and size > _HANDSHAKE_FRAME:
        raise AuthenticationFailed(f"oversized frame ({size} bytes) during the handshake")
    end = _HEADER.size + size
    if len(buffer) < end:
        return None
    payload = bytes(buffer[_HEADER.size : end])
    del buffer[:end]
    return payload
