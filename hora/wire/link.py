"""A worker's link to its driver: `log_to_driver`, hora's own reports, and keys derived from the
run's secret.

The worker bootstrap (`hora.rank.worker`) attaches one `DriverLink` while the user's job runs; code
deeper down (the collectives' stall inspector, the timeline, checkpoints) asks `current()` and
works as a plain process would when there is none, so the same training code runs anywhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from hora.wire.channel import Connection
from hora.wire.protocol import (
    RESIZED_METRIC,
    Formed,
    InPlace,
    Joining,
    Metrics,
    Output,
    Reform,
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
        #: set when the driver says that an elastic run has more slots (HostsUpdated)
        self.hosts_updated = threading.Event()
        #: ... and, > 0, the world re-formed in place that new ranks wait in (not a restart)
        self.grow_into = 0
        #: the driver's latest word to re-form the world in place (`Reform`), and when it came
        self._reform: Reform | None = None
        self._reform_came = threading.Condition()
        #: told of each `Reform` as it comes, on the channel's thread (`watching_reforms`)
        self._reform_watchers: list[Callable[[Reform], None]] = []

    def send(
        self,
        message: Output | Stall | TimelineBatch | Metrics | Resumed | ToTheDriver,
    ) -> None:
        """Send one message; may raise OSError when the driver is gone."""
        self.conn.send(message)


_current: DriverLink | None = None


class ResizeExit(BaseException):
    """Ends a rank of an elastic run cleanly at commit `commit`, so that the driver starts the
    run again at another size (raised by hvd.elastic's run; the bootstrap reports it)."""

    def __init__(self, commit: int):
        super().__init__(commit)
        self.commit = commit


def note_hosts_updated(generation: int = 0) -> None:
    """The driver said more slots are free (the bootstrap's channel thread calls this);
    `generation` > 0: new ranks wait to join the running ones in that world at their next
    commit."""
    if _current is not None:
        _current.grow_into = generation
        _current.hosts_updated.set()


def note_reform(message: Reform) -> None:
    """The driver said to re-form the world in place (the bootstrap's channel thread)."""
    link = _current
    if link is not None:
        with link._reform_came:
            link._reform = message
            link._reform_came.notify_all()
            watchers = list(link._reform_watchers)
        for watcher in watchers:
            with contextlib.suppress(Exception):  # the channel's thread must go on reading
                watcher(message)


@contextlib.contextmanager
def watching_reforms(watcher: Callable[[Reform], None]) -> Iterator[None]:
    """Call `watcher` with each `Reform` that comes while the block runs, on the channel's
    thread (a rank blocked in a store's wait cannot look itself); nothing outside a worker."""
    link = _current
    if link is None:
        yield
        return
    with link._reform_came:
        link._reform_watchers.append(watcher)
    try:
        yield
    finally:
        with link._reform_came:
            link._reform_watchers.remove(watcher)


def wait_reform(after: int, timeout: float) -> Reform | None:
    """The driver's `Reform` of a generation past `after`, waiting up to `timeout` seconds for
    it; None outside a hora worker or when none came (no rank was lost: Horovod's own reset
    follows)."""
    link = _current
    if link is None:
        return None
    with link._reform_came:
        link._reform_came.wait_for(
            lambda: link._reform is not None and link._reform.generation > after, timeout
        )
        reform = link._reform
    return reform if reform is not None and reform.generation > after else None


def hosts_updated() -> bool:
    """Whether the driver has said, in this rank, that the elastic run can grow."""
    return _current is not None and _current.hosts_updated.is_set()


GROW_BY_RESTART, GROW_IN_PLACE = 1, 2


def grown(world: int) -> None:
    """This rank re-formed into world `world` to grow: the driver's word for it is spent (a
    word that arrives late is read as spent too, by `growth_word`)."""
    link = _current
    if link is not None and 0 < link.grow_into <= world:
        link.hosts_updated.clear()


def growth_word(world: int) -> int:
    """What the driver said of growing, for a rank in world `world` (its generation): 0
    nothing (or a growth into this world or an older one, already done), GROW_BY_RESTART, or
    GROW_IN_PLACE (new ranks wait in a later world)."""
    link = _current
    if link is None or not link.hosts_updated.is_set():
        return 0
    into = link.grow_into
    if not into:
        return GROW_BY_RESTART
    return GROW_IN_PLACE if into > world else 0


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
