"""The recorder the collective loop calls on every phase, and the thread that ships what it records.

The hot path appends one tuple (wall-clock ns, kind, tensor, phase, args) to a deque: no
formatting, no I/O, no lock (deque appends are atomic). A flusher thread wakes every
`FLUSH_SECONDS`, takes what is there and hands it to a sink (the driver's channel or the file).
"""

from __future__ import annotations

import marshal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from hora.timeline._events import CYCLE, REGION_PREFIX, STOP, RawEvent
from hora.timeline.hooks import Recorder

FLUSH_SECONDS = 0.25
_now = time.time_ns

Sink = Callable[[list[RawEvent]], None]


class BufferRecorder(Recorder):
    """Records phase boundaries into memory; `drain()` takes them out."""

    enabled = True

    def __init__(self, mark_cycles: bool = False) -> None:
        self.mark_cycles = mark_cycles
        self._events: deque[RawEvent] = deque()
        self._push = self._events.append

    def begin(self, name: str, phase: str, args: dict[str, Any] | None = None) -> None:
        self._push((_now(), "B", name, phase, args))

    def end(self, name: str, phase: str, args: dict[str, Any] | None = None) -> None:
        self._push((_now(), "E", name, phase, args))

    def cycle(self) -> None:
        if self.mark_cycles:
            self._push((_now(), CYCLE, "", "CYCLE_START", None))

    def region(self, kind: str, name: str) -> None:
        """A user region (`timeline_context`) begins ("B") or ends ("E") on this thread."""
        self._push((_now(), kind, REGION_PREFIX + threading.current_thread().name, name, None))

    def stop_marker(self) -> None:
        self._push((_now(), STOP, "", "", None))

    def drain(self) -> list[RawEvent]:
        """What was recorded so far, in order (safe while other threads keep recording)."""
        events, pop = self._events, self._events.popleft
        return [pop() for _ in range(len(events))]


class Flusher:
    """Moves batches from a recorder to a sink on a background thread until `close()`."""

    def __init__(self, recorder: BufferRecorder, sink: Sink, interval: float = FLUSH_SECONDS):
        self.recorder = recorder
        self._sink: Sink | None = sink
        self._interval = interval
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="hora-timeline", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            batch = self.recorder.drain()
            if not batch or self._sink is None:
                return
            try:
                self._sink(batch)
            except Exception as exc:  # a timeline never stops training
                self._sink = None
                print(f"hora: stopped writing the timeline: {exc}", file=sys.stderr)

    def close(self) -> None:
        """Stop the thread and ship the rest."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self.flush()


def pack(batch: list[RawEvent]) -> bytes | list[RawEvent]:
    """The batch for the channel: marshal is ~3x cheaper than pickle for these tuples, and the
    flusher runs under the rank's GIL. (hora already needs one Python version on every host.)"""
    try:
        return marshal.dumps(batch)
    except ValueError:  # an argument marshal cannot encode: let the channel pickle it
        return batch
