"""The driver's side: ranks send raw event batches over the job's channel; one file is written.

Ranks on other hosts (Spark executors) cannot write the file where the driver asked for it, so
under a hora launcher every rank ships its batches here and the driver converts and writes them.
That happens on a writer thread at the lowest CPU priority: where the driver shares cores with
the ranks (local runs) the trace may lag behind while they compute, rather than slow them down.
`close()` writes the rest before the run returns.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import queue
import sys
import threading
import uuid
from typing import Any

from hora.timeline._events import RankTrack, RawEvent
from hora.timeline._file import TraceFile


class DriverTimeline:
    """Trace files of one job, keyed by path; each file has one track converter per rank."""

    def __init__(self) -> None:
        self._job = uuid.uuid4().hex
        self._files: dict[str, tuple[TraceFile, dict[int, RankTrack]] | None] = {}
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def receive(self, rank: int, path: str, batch: bytes | list[RawEvent]) -> None:
        """Queue `("timeline", rank, path, events)` from a worker for the writer thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="hora-timeline", daemon=True)
            self._thread.start()
        self._inbox.put((rank, path, batch))

    def _run(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # not Linux: normal priority
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while (item := self._inbox.get()) is not None:
            self._write(*item)

    def _write(self, rank: int, path: str, batch: bytes | list[RawEvent]) -> None:
        events = marshal.loads(batch) if isinstance(batch, bytes) else batch
        key = os.path.abspath(path)
        if key not in self._files:
            try:
                self._files[key] = (TraceFile(key, self._job), {})
            except OSError as exc:
                self._files[key] = None  # say it once; the job itself goes on
                print(f"hora: cannot write the timeline to {key}: {exc}", file=sys.stderr)
        entry = self._files[key]
        if entry is None:
            return
        trace, tracks = entry
        track = tracks.get(rank)
        if track is None:
            track = tracks[rank] = RankTrack(rank)
        try:
            trace.append(track.convert(events))
        except OSError as exc:
            self._files[key] = None
            trace.close()
            print(f"hora: stopped writing the timeline to {key}: {exc}", file=sys.stderr)

    def close(self) -> None:
        """Write what is queued, then close the files."""
        if self._thread is not None:
            self._inbox.put(None)
            self._thread.join()
            self._thread = None
        for entry in self._files.values():
            if entry is not None:
                entry[0].close()
        self._files.clear()
