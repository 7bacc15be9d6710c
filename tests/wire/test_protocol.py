"""The wire's messages: a worker's boot line, and the allow-list every job channel applies."""

from __future__ import annotations

import pickle
import queue
import socket

import pytest

from hora.wire import channel
from hora.wire.protocol import ALLOWED, Boot, Go, Hello, Plan, Stop, TaskReady


def test_boot_round_trips_through_its_json_line() -> None:
    boot = Boot(("10.0.0.1", 4242), b"\x00\xffsecret", 3, ("/a", "/b c"), "pkg.mod:setup")
    line = boot.to_line()
    assert line.endswith("\n") and line.count("\n") == 1
    assert Boot.from_line(line) == boot
    assert boot.secret.hex() in line  # bytes travel as hex in the JSON line


def test_every_message_of_the_conversation_passes_the_allow_list() -> None:
    plan = Plan([{"host": "h", "gpus": ["0"], "cpus": 2}], ("h", 1), False, {"A": "1"}, "/tmp")
    for message in (Hello(0, 1, "h"), TaskReady(1, {"host": "h"}), Go(plan, 0), Stop()):
        assert channel.loads(channel.pack(message), ALLOWED) == message


class _Evil:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (print, ("unpickled",))


def test_an_authenticated_peer_naming_another_class_is_cut_off() -> None:
    """Defence in depth: holding the secret does not let a peer name `print` (or os.system)."""
    inbox: queue.Queue = queue.Queue()
    server = channel.Server(channel.new_secret(), inbox, ALLOWED)
    try:
        sock = socket.create_connection(server.address)
        channel.authenticate_as_client(sock, server._secret)
        channel.send_frame(sock, pickle.dumps(Hello(0, 1, "h")))
        channel.send_frame(sock, pickle.dumps(_Evil()))
        _conn, first = inbox.get(timeout=5)
        assert first == Hello(0, 1, "h")
        _conn, closed = inbox.get(timeout=5)
        assert closed is None  # the frame was refused and the connection ended
        sock.settimeout(5)
        assert sock.recv(1) == b""
        sock.close()
        with pytest.raises(queue.Empty):
            inbox.get(timeout=0.2)
    finally:
        server.close()
