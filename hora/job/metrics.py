"""Live metrics on the driver: every rank's `hora.report`, one line per step, and the reporters.

A step is complete once every rank has reported it, once every rank that reports at all has (a
job where only rank 0 reports is learnt from its first step), or a few seconds after its first
report. Then its numbers are averaged over the ranks that reported them (anything else is the
lowest reporting rank's), the step is printed, handed to each reporter (`report_to`:
TensorBoard, MLflow, any callable; on a thread of their own, so that a slow one never holds up
the ranks' logs) and kept for the run's history. A report that arrives after its step was
emitted still counts in the history. One log lasts the whole run: a restarted attempt that
reports a step again replaces it. A world re-formed in place shows in the first step after it:
its metrics carry `"resized": {"from", "to", "seconds", "commit", "why"}`, in the history and
for the reporters (which chart the new world size from there).
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from hora.config import Reporter
from hora.wire.protocol import RESIZED_METRIC

SETTLE_SECONDS = 3.0


class MetricsLog:
    """The reports of one run, aggregated per step."""

    def __init__(self, reporters: Sequence[Reporter] = (), progress: bool = True):
        self.progress = progress
        self.np = 1  # the attempt's world size: a step is complete when this many reported it
        self._attempt = 0
        self._reporting: set[int] = set()  # the ranks that reported anything in this attempt
        self._known_reporters = False  # a step has completed: `_reporting` is the whole set
        self._pending: dict[int, dict[int, dict[str, Any]]] = {}  # step -> rank -> values
        self._first_seen: dict[int, float] = {}
        self._emitted: dict[int, tuple[int, dict[int, dict[str, Any]]]] = {}  # (attempt, ranks)
        self._history: dict[int, dict[str, Any]] = {}
        self._resized: dict[str, Any] | None = None  # for the next step emitted
        self._resizes: dict[int, dict[str, Any]] = {}  # step -> the resize it came after
        self._delivery = _Delivery(reporters) if reporters else None

    def start_attempt(self, index: int, np: int) -> None:
        """A new attempt (of `np` ranks) reports from now on; its steps replace earlier ones."""
        self.flush(everything=True)
        self._attempt, self.np = index, np
        self._reporting, self._known_reporters = set(), False

    def resized(self, event: dict[str, Any]) -> None:
        """A world re-formed in place to `event["to"]` ranks: the old world's steps are
        emitted, the next ones complete at the new size, and the first carries `event`."""
        if event["to"] != self.np:
            self.start_attempt(self._attempt, event["to"])
        self._resized = dict(event)

    def receive(self, rank: int, step: int, values: dict[str, Any]) -> None:
        self._reporting.add(rank)
        emitted = self._emitted.get(step)
        if emitted is not None and emitted[0] == self._attempt and rank not in emitted[1]:
            emitted[1][rank] = values  # late for its line, not for the history
            self._history[step] = self._with_resize(step, aggregate(emitted[1]))
            return
        self._pending.setdefault(step, {})[rank] = values
        self._first_seen.setdefault(step, time.monotonic())

    def flush(self, everything: bool = False) -> None:
        """Emit the steps that are complete (all of them with `everything`), in step order."""
        now = time.monotonic()
        for step in sorted(self._pending):
            by_rank = self._pending[step]
            if everything or self._complete(by_rank, now - self._first_seen[step]):
                del self._pending[step], self._first_seen[step]
                self._emit(step, by_rank)

    def close(self) -> None:
        self.flush(everything=True)
        if self._delivery is not None:
            self._delivery.close()

    def history(self) -> list[dict[str, Any]]:
        """Every emitted step, in step order: `{"step": 3, "loss": 0.21, ...}`."""
        return [{"step": step, **self._history[step]} for step in sorted(self._history)]

    def _complete(self, by_rank: dict[int, dict[str, Any]], age: float) -> bool:
        if len(by_rank) >= self.np or age >= SETTLE_SECONDS:
            return True
        return self._known_reporters and self._reporting <= by_rank.keys()

    def _emit(self, step: int, by_rank: dict[int, dict[str, Any]]) -> None:
        self._known_reporters = True
        if self._resized is not None:
            self._resizes[step], self._resized = self._resized, None
        values = self._with_resize(step, aggregate(by_rank))
        self._emitted[step] = (self._attempt, by_rank)
        self._history[step] = values
        if self.progress:  # (a resize the driver has said in a line of its own)
            shown = ", ".join(f"{k}={_shown(v)}" for k, v in values.items() if k != RESIZED_METRIC)
            ranks = f" (mean of {len(by_rank)} ranks)" if len(by_rank) > 1 else ""
            print(f"hora: step {step}: {shown}{ranks}", file=sys.stderr, flush=True)
        if self._delivery is not None:
            self._delivery.put(step, dict(values))

    def _with_resize(self, step: int, values: dict[str, Any]) -> dict[str, Any]:
        resize = self._resizes.get(step)
        return values if resize is None else values | {RESIZED_METRIC: dict(resize)}


class _Delivery:
    """The reporters, called in order on one thread. One that fails is named once and gets
    nothing more; the run goes on."""

    def __init__(self, reporters: Sequence[Reporter]):
        self._reporters = list(reporters)
        self._queue: queue.Queue[tuple[int, dict[str, Any]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._deliver, name="hora-reporters", daemon=True)
        self._thread.start()

    def put(self, step: int, values: dict[str, Any]) -> None:
        self._queue.put((step, values))

    def close(self) -> None:
        """Deliver what is queued, then close every reporter that has a `close()`."""
        self._queue.put(None)
        self._thread.join()

    def _deliver(self) -> None:
        while (item := self._queue.get()) is not None:
            for reporter in list(self._reporters):
                self._call(reporter, reporter, *item)
        for reporter in list(self._reporters):
            close = getattr(reporter, "close", None)
            if callable(close):
                self._call(reporter, close)

    def _call(self, reporter: Reporter, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:
            self._reporters.remove(reporter)
            print(
                f"hora: the reporter {reporter!r} failed ({type(exc).__name__}: {exc}); it gets "
                "no more metrics",
                file=sys.stderr,
                flush=True,
            )


def aggregate(by_rank: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Numbers averaged over the ranks that reported them; anything else the lowest rank's."""
    names: list[str] = []
    for rank in sorted(by_rank):
        names += [name for name in by_rank[rank] if name not in names]
    values: dict[str, Any] = {}
    for name in names:
        reported = [by_rank[r][name] for r in sorted(by_rank) if name in by_rank[r]]
        numbers = [v for v in reported if isinstance(v, int | float) and not isinstance(v, bool)]
        values[name] = sum(numbers) / len(numbers) if len(numbers) == len(reported) else reported[0]
    return values


def _shown(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
