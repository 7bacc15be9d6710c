"""The driver's side: ranks send raw event batches over the job's channel; one file is written.

Ranks on other hosts (Spark executors) cannot write the file where the driver asked for it, so
under a hora launcher every rank ships its batches here and the driver converts and writes them.
That happens on a writer thread at the lowest CPU priority: where the driver shares cores with
the ranks (local runs) the trace may lag behind while they compute, rather than slow them down.
`close()` writes the rest before the run returns. The driver has a track of its own, where
`mark` draws run-level instants (a restart) in every trace file of the run.
"""

from __future__ import annotations

import contextlib
import json
import marshal
import os
import queue
import sys
import threading
import time
import uuid
from typing import Any

from hora.timeline._events import STOP, RankTrack, RawEvent
from hora.timeline._file import TraceFile

DRIVER_PID = -1  # the driver's track: sorted above rank 0


class DriverTimeline:
    """Trace files of one job, keyed by path; each file has one track converter per rank."""

    def __init__(self) -> None:
        self._job = uuid.uuid4().hex
        self._files: dict[str, tuple[TraceFile, dict[int, RankTrack]] | None] = {}
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._marks: list[str] = []  # the driver track's events, for files opened later too

    def receive(self, rank: int, path: str, batch: bytes | list[RawEvent]) -> None:
        """Queue a worker's batch of raw events for the file at `path`."""
        self._put((rank, path, batch))

    def mark(self, name: str, args: dict[str, Any]) -> None:
        """An instant event on the driver's track of every file (those opened later included);
        open phases of every rank are closed first: the processes that began them are gone."""
        self._put(("mark", time.time_ns(), name, args))

    def _put(self, item: tuple[Any, ...]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="hora-timeline", daemon=True)
            self._thread.start()
        self._inbox.put(item)

    def _run(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # not Linux: normal priority
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while (item := self._inbox.get()) is not None:
            if item[0] == "mark":
                self._write_mark(*item[1:])
            else:
                self._write(*item)

    def _write_mark(self, ns: int, name: str, args: dict[str, Any]) -> None:
        first = not self._marks
        if first:
            self._marks += _driver_track_names()
        event = {"name": name, "ph": "i", "s": "g", "ts": ns / 1000, "pid": DRIVER_PID, "tid": 0}
        self._marks.append(json.dumps(event | {"args": args}, separators=(",", ":")))
        new = self._marks if first else self._marks[-1:]
        for key, entry in list(self._files.items()):
            if entry is None:
                continue
            trace, tracks = entry
            out: list[str] = []
            for track in tracks.values():
                out += track.convert([(ns, STOP, "", "", None)])
            try:
                trace.append(out + new)
            except OSError as exc:
                self._files[key] = None
                trace.close()
                print(f"hora: stopped writing the timeline to {key}: {exc}", file=sys.stderr)

    def _write(self, rank: int, path: str, batch: bytes | list[RawEvent]) -> None:
        events = marshal.loads(batch) if isinstance(batch, bytes) else batch
        key = os.path.abspath(path)
        if key not in self._files:
            try:
                self._files[key] = (TraceFile(key, self._job), {})
                if self._marks:
                    self._files[key][0].append(self._marks)  # type: ignore[index]
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


def _driver_track_names() -> list[str]:
    return [
        json.dumps(
            {"name": what, "ph": "M", "pid": DRIVER_PID, "tid": 0, "args": {key: value}},
            separators=(",", ":"),
        )
        for what, key, value in (
            ("process_name", "name", "driver"),
            ("process_sort_index", "sort_index", DRIVER_PID),
        )
    ]
