"""`log_to_driver`: the one way a worker's message reaches the driver under "log_callback_only"."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from hora._channel import Connection

_channel: Connection | None = None
_rank: int | None = None
#: run (in order, errors ignored) while the channel is still up, just before the job's result is
#: sent: the timeline ships its last events here.
before_detach: list[Callable[[], None]] = []


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
    _channel.send(("output", _rank, "log", str(message)))
