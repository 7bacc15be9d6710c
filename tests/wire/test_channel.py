"""The driver channel: nothing is unpickled from a peer that has not proved it holds the secret."""

from __future__ import annotations

import os
import pickle
import queue
import socket
import struct
import threading
import time

import pytest

from hora.wire import channel as _channel
from hora.wire.protocol import ALLOWED, Heartbeat, Hello, Output


class Boom:
    def __reduce__(self):
        return (exec, ("raise SystemExit('unpickled an unauthenticated frame')",))


def _read_challenge(sock: socket.socket) -> bytes:
    """The server's first frame, read whole: TCP may deliver its header and nonce apart."""
    data = b""
    while len(data) < 8 + 32:
        chunk = sock.recv(8 + 32 - len(data))
        assert chunk, "the server closed before sending its challenge"
        data += chunk
    return data


@pytest.fixture
def server():
    inbox: queue.Queue = queue.Queue()
    srv = _channel.Server(_channel.new_secret(), inbox, ALLOWED)
    yield srv, inbox
    srv.close()


def test_authenticated_round_trip(server):
    srv, inbox = server
    conn = _channel.connect(srv.address, srv._secret, ALLOWED)
    conn.send(("hello", 1))
    peer, message = inbox.get(timeout=5)
    assert message == ("hello", 1)
    peer.send("reply")
    assert conn.recv() == "reply"
    conn.close()
    assert inbox.get(timeout=5)[1] is None  # the close is reported


def test_wrong_secret_is_refused_and_nothing_is_delivered(server):
    srv, inbox = server
    with pytest.raises((_channel.AuthenticationFailed, ConnectionError)):
        conn = _channel.connect(srv.address, b"not the secret" * 3, ALLOWED)
        conn.recv()
    with pytest.raises(queue.Empty):
        inbox.get(timeout=0.5)


def test_a_pickle_sent_without_the_handshake_is_never_unpickled(server):
    srv, inbox = server
    sock = socket.create_connection(srv.address)
    _read_challenge(sock)
    frame = pickle.dumps(Boom())
    sock.sendall(struct.pack("!Q", len(frame)) + frame)
    with pytest.raises(queue.Empty):
        inbox.get(timeout=0.5)
    sock.close()


def test_a_huge_frame_before_the_handshake_is_refused(server):
    srv, _inbox = server
    sock = socket.create_connection(srv.address)
    _read_challenge(sock)
    sock.sendall(struct.pack("!Q", 1 << 40))  # would make a naive server allocate a terabyte
    sock.settimeout(5)
    assert sock.recv(1) == b""  # the server hung up
    sock.close()


def test_a_worker_refuses_a_driver_without_the_secret():
    """An impostor driver cannot answer the worker's challenge, so it never gets to send a job."""
    listener = socket.create_server(("127.0.0.1", 0))

    def impostor():
        sock, _ = listener.accept()
        sock.sendall(struct.pack("!Q", 32) + os.urandom(32))  # a challenge
        sock.recv(8 + 64)  # the worker's answer and its own challenge
        sock.sendall(struct.pack("!Q", 32) + os.urandom(32))  # a guess at the answer
        sock.recv(1)

    thread = threading.Thread(target=impostor, daemon=True)
    thread.start()
    with pytest.raises(_channel.AuthenticationFailed, match="driver failed to prove"):
        _channel.connect(listener.getsockname(), _channel.new_secret(), ALLOWED)
    thread.join(timeout=5)
    listener.close()


def test_one_thread_serves_many_connections_and_a_quiet_message_only_says_it_came():
    """A hundred peers cost the server one thread; a heartbeat (a `quiet` type) is not queued,
    it only moves its connection's `heard_at`; a close from the driver's side is reported."""
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    secret = _channel.new_secret()
    srv = _channel.Server(secret, inbox, ALLOWED, quiet=(Heartbeat,))
    threads = threading.active_count()
    try:
        peers = [_channel.connect(srv.address, secret, ALLOWED) for _ in range(100)]
        assert threading.active_count() == threads
        for rank, peer in enumerate(peers):
            peer.send(Hello(rank, 0, "h"))
        served = {msg.rank: conn for conn, msg in (inbox.get(timeout=5) for _ in peers)}
        assert sorted(served) == list(range(100))
        before = served[7].heard_at
        time.sleep(0.01)
        peers[7].send(Heartbeat(7))
        peers[7].send(Output(7, "stdout", "after the beat"))
        conn, message = inbox.get(timeout=5)
        assert message == Output(7, "stdout", "after the beat") and conn is served[7]
        assert conn.heard_at > before
        conn.close()  # the driver hangs up: the peer and the inbox hear of it
        assert inbox.get(timeout=5) == (conn, None)
        with pytest.raises(_channel.ChannelClosed):
            peers[7].recv()
        for peer in peers:
            peer.close()
    finally:
        srv.close()
