"""Jobs for the negotiation channel's security tests, run inside real ranks by hora.run."""

from __future__ import annotations

import logging
import os
import pickle
import socket
import struct

import torch

import hora.torch as hvd
from hora.collectives._control import channel as _channel
from hora.wire import link


class Touch:
    """Unpickling this creates `path`: proof that a frame was unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (self.path, "w"))


def evil_frame(path: str) -> bytes:
    payload = pickle.dumps([Touch(path)], protocol=pickle.HIGHEST_PROTOCOL)
    return struct.pack("!Q", len(payload)) + payload


class _Refusals(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "refused a negotiation connection" in record.getMessage():
            self.count += 1


def intruder_before_init(marker: str, store_mode: bool) -> dict[str, object]:
    """Rank 1 sends a malicious pickle to rank 0's port (no key) before connecting for real."""
    if store_mode:  # behave as under torchrun: no launcher key, the key comes from the store
        link._current = None
    refusals = _Refusals()
    logging.getLogger("hora.torch").addHandler(refusals)
    real_connect = _channel.connect

    def connect_after_an_intruder(address: str, rank: int, key: bytes, timeout: float):  # type: ignore[no-untyped-def]
        host, port = address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=timeout) as rogue:
            try:
                rogue.sendall(evil_frame(marker))  # the old protocol's hello position
                rogue.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # rank 0 may already have refused and closed it (ENOTCONN, EPIPE)
            rogue.settimeout(timeout)
            try:
                while rogue.recv(4096):  # rank 0 answers with its challenge, then hangs up
                    pass
            except ConnectionResetError:
                pass  # or resets, as the intruder's frame was never read
        return real_connect(address, rank, key, timeout)

    if int(os.environ.get("RANK", "0")) == 1:
        _channel.connect = connect_after_an_intruder  # type: ignore[assignment]
    try:
        hvd.init()
        total = hvd.allreduce(torch.ones(3), op=hvd.Sum).tolist()
        hvd.shutdown()
    finally:
        _channel.connect = real_connect  # type: ignore[assignment]
        logging.getLogger("hora.torch").removeHandler(refusals)
    return {"sum": total, "refused": refusals.count, "unpickled": os.path.exists(marker)}
