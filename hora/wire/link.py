"""`log_to_driver`: the one way a worker's message reaches the driver under "log_callback_only"."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
from collections.abc import Callable

from hora._channel import Connection
from hora.job.protocol import Output, Stall

_channel: Connection | None = None
_rank: int | None = None
#: run (in order, errors ignored) while the channel is still up, just before the job's result is
#: sent: the timeline ships its last events here.
before_detach: list[Callable[[], None]] = []
_negotiation_key: bytes | None = None


def set_run_secret(secret: bytes) -> None:
    """Called by the worker bootstrap: keep only keys *derived* from the run's secret."""
    global _negotiation_key
    _negotiation_key = hmac.new(secret, b"hora.torch negotiation", hashlib.sha256).digest()


def negotiation_key() -> bytes | None:
    """HMAC(run secret, b"hora.torch negotiation") under a hora launcher, else None.

    hora.torch authenticates its negotiation sockets with it; the secret itself never leaves the
    bootstrap (nor enters the environment).
    """
    return _negotiation_key


def attach(conn: Connection, rank: int) -> None:
    """Called by the worker bootstrap once the driver channel is up."""
    global _channel, _rank
    _channel, _rank = conn, rank


def detach() -> None:
    global _channel, _rank
    for hook in list(before_detach):
        with contextlib.suppress(Exception):  # the job's result must still be sent
            hook()
    _channel, _rank = None, None


def log_to_driver(message: str) -> None:
    """Send `message` to the driver's output, whatever `driver_log_verbosity` says.

    Outside a hora worker it is printed, so the same training code runs in a plain process.
    """
    if _channel is None:
        print(message, flush=True)
        return
    _channel.send(Output(_rank, "log", str(message)))  # type: ignore[arg-type]


def send_to_driver(message: Stall) -> bool:
    """Send one of hora's own messages (not the user's output) to the driver; False outside a
    hora worker. May raise OSError when the driver is gone."""
    channel = _channel
    if channel is None:
        return False
    channel.send(message)
    return True
