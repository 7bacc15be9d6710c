"""A worker's link to its driver: `log_to_driver`, hora's own reports, and keys derived from the
run's secret.

The worker bootstrap (`hora._worker`) attaches one `DriverLink` while the user's job runs; code
deeper down (the collectives' stall inspector, the timeline, checkpoints) asks `current()` and
works as a plain process would when there is none, so the same training code runs anywhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
from collections.abc import Callable

from hora.wire.channel import Connection
from hora.wire.protocol import Output, Stall, TimelineBatch


class DriverLink:
    """The job channel of one rank, with what is derived from the run's secret."""

    def __init__(self, conn: Connection, rank: int, secret: bytes):
        self.conn = conn
        self.rank = rank
        #: HMAC(run secret, b"hora.torch negotiation"): hora.collectives authenticates its
        #: negotiation star with it; the secret itself never leaves the bootstrap (nor enters
        #: the environment).
        self.negotiation_key = hmac.new(secret, b"hora.torch negotiation", hashlib.sha256).digest()
        #: run (in order, errors ignored) while the channel is still up, just before the job's
        #: result is sent: the timeline ships its last events here.
        self.before_detach: list[Callable[[], None]] = []

    def send(self, message: Output | Stall | TimelineBatch) -> None:
        """Send one message; may raise OSError when the driver is gone."""
        self.conn.send(message)


_current: DriverLink | None = None


def current() -> DriverLink | None:
    """This worker's link while its job runs; None in a plain process."""
    return _current


def attach(link: DriverLink) -> None:
    """Called by the worker bootstrap once the driver channel is up and the job is in hand."""
    global _current
    _current = link


def detach() -> None:
    """Run the link's last hooks, then forget it (the bootstrap sends the result after)."""
    global _current
    link = _current
    if link is not None:
        for hook in list(link.before_detach):
            with contextlib.suppress(Exception):  # the job's result must still be sent
                hook()
    _current = None


def log_to_driver(message: str) -> None:
    """Send `message` to the driver's output, whatever `driver_log_verbosity` says.

    Outside a hora worker it is printed, so the same training code runs in a plain process.
    """
    link = _current
    if link is None:
        print(message, flush=True)
        return
    link.send(Output(link.rank, "log", str(message)))


def send_to_driver(message: Stall) -> bool:
    """Send one of hora's own messages (not the user's output) to the driver; False outside a
    hora worker. May raise OSError when the driver is gone."""
    link = _current
    if link is None:
        return False
    link.send(message)
    return True
