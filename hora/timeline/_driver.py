"""The driver's side: ranks send raw event batches over the job's channel; one file is written.

Ranks on other hosts (Spark executors) cannot write the file where the driver asked for it, so
under a hora launcher every rank ships its batches here and the driver converts and writes them.
The driver's monitor loop is otherwise idle, so the conversion costs the ranks nothing.
"""

from __future__ import annotations

import marshal
import os
import sys
import uuid

from hora.timeline._events import RankTrack, RawEvent
from hora.timeline._file import TraceFile


class DriverTimeline:
    """Trace files of one job, keyed by path; each file has one track converter per rank."""

    def __init__(self) -> None:
        self._job = uuid.uuid4().hex
        self._files: dict[str, tuple[TraceFile, dict[int, RankTrack]] | None] = {}

    def receive(self, rank: int, path: str, batch: bytes | list[RawEvent]) -> None:
        """Handle `("timeline", rank, path, events)` from a worker (events marshalled or not)."""
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

    @property
    def paths(self) -> list[str]:
        return [p for p, entry in self._files.items() if entry is not None]

    def close(self) -> None:
        for entry in self._files.values():
            if entry is not None:
                entry[0].close()
        self._files.clear()
