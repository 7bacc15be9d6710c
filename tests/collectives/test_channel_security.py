"""The negotiation star authenticates every socket before unpickling, and unpickles narrowly."""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import struct
import threading

import pytest

import hora
from hora.collectives import _messages
from hora.collectives._control import channel as _channel
from hora.collectives._messages import (
    JOIN,
    STOP,
    Bucket,
    CacheDrop,
    Entry,
    Failure,
    JoinDone,
    ProcessSetChange,
    Request,
    Shutdown,
)
from hora.wire.channel import AuthenticationFailed, recv_frame, send_frame
from tests.collectives import _security_cases
from tests.collectives._security_cases import Touch, evil_frame

KEY = b"k" * 32


def _serve(workers: int, key: bytes = KEY, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    server, address = _channel.listen("127.0.0.1")
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["peers"] = _channel.accept_children(server, range(1, workers + 1), key, timeout)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return address, thread, box


def _close(box: dict[str, object]) -> None:
    for sock in box.get("peers", {}).values():  # type: ignore[union-attr]
        sock.close()


def _drain(sock: socket.socket) -> None:
    sock.settimeout(20)
    try:
        while sock.recv(4096):
            pass
    except OSError:
        pass


def test_peer_without_the_key_is_refused_and_nothing_it_sends_is_unpickled(tmp_path) -> None:
    marker = str(tmp_path / "unpickled")
    address, thread, box = _serve(1)
    host, port = address.rsplit(":", 1)
    # 1. a raw pickle where the old protocol expected its hello
    with socket.create_connection((host, int(port))) as rogue:
        rogue.sendall(evil_frame(marker))
        # the server may already have refused and closed: then there is nothing to half-close
        with contextlib.suppress(OSError):
            rogue.shutdown(socket.SHUT_WR)
        _drain(rogue)
    # 2. a peer that answers the challenge with the wrong key, then sends the pickle anyway
    with pytest.raises((AuthenticationFailed, ConnectionError, OSError)):
        _channel.connect(address, 1, b"wrong" * 7, 20.0)
    with socket.create_connection((host, int(port))) as rogue:
        rogue.sendall(evil_frame(marker) * 3)
        _drain(rogue)
    assert thread.is_alive() and "peers" not in box  # no rank's place was taken
    worker = _channel.connect(address, 1, KEY, 20.0)
    thread.join(20)
    try:
        assert set(box["peers"]) == {1}  # type: ignore[arg-type]
        assert not os.path.exists(marker)
        # the real rank still talks over its authenticated socket
        _channel.send_msg(worker, ["J"])
        assert _channel.recv_msg(box["peers"][1]) == ["J"]  # type: ignore[index]
    finally:
        worker.close()
        _close(box)


def test_a_worker_refuses_a_coordinator_without_the_key(tmp_path) -> None:
    """A fake rank 0 that cannot answer the worker's challenge gets nothing further."""
    marker = str(tmp_path / "unpickled")
    listener = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def fake_coordinator() -> None:
        conn, _ = listener.accept()
        with conn:
            send_frame(conn, os.urandom(32))  # a challenge
            recv_frame(conn, limit=64)  # the worker's answer and its own challenge
            send_frame(conn, os.urandom(32))  # a guess instead of the HMAC
            send_frame(conn, pickle.dumps([Touch(marker)]))
            conn.settimeout(20)
            try:
                while data := conn.recv(4096):
                    got.append(data)
            except OSError:
                pass

    thread = threading.Thread(target=fake_coordinator, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    with pytest.raises(AuthenticationFailed):
        _channel.connect(f"127.0.0.1:{port}", 1, KEY, 20.0)
    thread.join(20)
    listener.close()
    assert got == []  # the worker never sent its rank
    assert not os.path.exists(marker)


def test_a_duplicate_or_out_of_range_rank_is_refused() -> None:
    address, thread, box = _serve(2, timeout=20.0)
    first = _channel.connect(address, 1, KEY, 20.0)
    for bad in (1, 3, 0):
        s = _channel.connect(address, bad, KEY, 20.0)
        _drain(s)  # rank 0 closes it
        s.close()
    assert "peers" not in box
    second = _channel.connect(address, 2, KEY, 20.0)
    thread.join(20)
    try:
        assert set(box["peers"]) == {1, 2}  # type: ignore[arg-type]
    finally:
        first.close()
        second.close()
        _close(box)


def test_a_forbidden_class_in_a_frame_is_refused(tmp_path) -> None:
    marker = str(tmp_path / "unpickled")
    with pytest.raises(_channel.ForbiddenFrame, match=r"builtins|io"):
        _channel.loads(pickle.dumps([Touch(marker)]))
    with pytest.raises(_channel.ForbiddenFrame, match=r"(posix|os)\.system"):
        _channel.loads(pickle.dumps(os.system))
    assert not os.path.exists(marker)
    a, b = socket.socketpair()
    try:
        payload = pickle.dumps([Touch(marker)])
        a.sendall(struct.pack("!Q", len(payload)) + payload)
        with pytest.raises(_channel.ForbiddenFrame):
            _channel.recv_msg(b)
    finally:
        a.close()
        b.close()
    assert not os.path.exists(marker)


def test_the_engines_messages_pass_the_restricted_unpickler() -> None:
    req = Request("a", "allreduce", 0, ("float32",), ((4,),), "cpu", 16)
    msg = [
        req,
        JOIN,
        STOP,
        Bucket("allreduce", 0, [Entry("a", {0: req}), Entry("b", {0: req}, 7)]),
        CacheDrop((7, 8)),
        (3, [req, 7, JOIN]),  # a worker's frame: drops applied, then requests or cache ids
        Failure(0, "x", "why"),
        JoinDone(1),
        Shutdown("bye"),
        {1: [1.5, None, True]},
    ]
    got = _channel.loads(_channel.pack(msg))
    assert got == msg
    assert [type(m) for m in got] == [type(m) for m in msg]


def test_every_message_class_is_admitted_and_nothing_else_of_the_engine() -> None:
    """A message class added to `_messages` without the allow-list fails here, not in a job."""
    classes = {
        name
        for name, obj in vars(_messages).items()
        if isinstance(obj, type) and obj.__module__ == _messages.__name__
    }
    admitted = {name for module, name in _channel._ALLOWED_CLASSES if module == _messages.__name__}
    assert admitted == classes - {"ProcessSetChange"}  # that one never leaves its rank
    with pytest.raises(_channel.ForbiddenFrame, match="ProcessSetChange"):
        _channel.loads(_channel.pack([ProcessSetChange(1, (0, 1))]))


@pytest.mark.parametrize("store_mode", [False, True], ids=["launcher-key", "store-key"])
def test_real_ranks_refuse_an_intruder_and_still_meet(tmp_path, store_mode: bool) -> None:
    marker = str(tmp_path / "unpickled")
    results = hora.run(_security_cases.intruder_before_init, args=(marker, store_mode), np=2)
    assert [r["sum"] for r in results] == [[2.0, 2.0, 2.0]] * 2
    assert results[0]["refused"] == 1  # rank 0 refused the intruder
    assert not any(r["unpickled"] for r in results)
    assert not os.path.exists(marker)
