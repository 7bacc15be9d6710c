"""A worker's link to its driver: `log_to_driver`, hora's own reports, and keys derived from the
run's secret.

The worker bootstrap (`hora.rank.worker`) attaches one `DriverLink` while the user's job runs; code
deeper down (the collectives' stall inspector, the timeline, checkpoints) asks `current()` and
works as a plain process would when there is none, so the same training code runs anywhere.
What an elastic run's rank hears of its world and says of it goes through `hora.elastic`.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
from collections.abc import Callable, Mapping
from typing import Any

from hora.wire.channel import Connection
from hora.wire.protocol import (
    RESIZED_METRIC,
    Formed,
    InPlace,
    Joining,
    Metrics,
    Output,
    Reformed,
    Resumed,
    Stall,
    TimelineBatch,
)

#: what an elastic run's ranks tell the driver of their world
ToTheDriver = InPlace | Reformed | Joining | Formed


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
        self.steps_reported = 0  # `report`'s own step count, for calls that give none

    def send(
        self,
        message: Output | Stall | TimelineBatch | Metrics | Resumed | ToTheDriver,
    ) -> None:
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


def report(metrics: Mapping[str, Any], step: int | None = None) -> None:
    """Report one step's metrics (`{"loss": 0.21, "accuracy": 0.93}`) from any rank.

    The driver prints them as they come, hands them to the run's `report_to` callbacks
    (TensorBoard, MLflow, your own) and returns their history where asked
    (`return_metrics=True`): per step, numbers are averaged over the ranks that reported it,
    anything else is rank 0's (or the lowest reporting rank's). `step` defaults to this rank's
    count of its reports (1, 2, ...). Outside a hora worker the metrics are printed, so the same
    training code runs in a plain process.
    """
    values = _checked(metrics)
    link = _current
    if link is None:
        print(f"hora.report: step {step}: {values}" if step is not None else values, flush=True)
        return
    link.steps_reported += 1
    if step is None:
        step = link.steps_reported
    elif isinstance(step, bool) or not isinstance(step, int):
        raise TypeError(f"hora.report: step must be an int, got {step!r}")
    link.send(Metrics(link.rank, step, values))


def _checked(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Plain values only: numbers (Python's, numpy's or one-element tensors'), str, bool."""
    if not isinstance(metrics, Mapping):
        raise TypeError(f"hora.report takes a dict of metrics, got {type(metrics).__name__}")
    values: dict[str, Any] = {}
    for name, value in metrics.items():
        if not isinstance(name, str):
            raise TypeError(f"hora.report: metric names must be str, got {name!r}")
        if name == RESIZED_METRIC:  # it would be replaced, unsaid, on the step after a resize
            raise ValueError(
                f"hora.report: the name {name!r} is hora's own (the first step after an elastic "
                "world re-formed in place carries the resize under it); call your metric "
                "something else"
            )
        if hasattr(value, "item") and callable(value.item):  # a tensor's or numpy's scalar
            value = value.item()
        if not isinstance(value, int | float | str | bool | None):
            raise TypeError(
                f"hora.report: {name}={value!r} is not a number or a string; report plain "
                "values (a tensor of one element is turned into its number)"
            )
        values[name] = value
    return values


def send_to_driver(message: Stall | Resumed | ToTheDriver) -> bool:
    """Send one of hora's own messages (not the user's output) to the driver; False outside a
    hora worker. May raise OSError when the driver is gone."""
    link = _current
    if link is None:
        return False
    link.send(message)
    return True
