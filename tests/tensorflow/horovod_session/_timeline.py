"""A timeline file the suites record into: one for every rank of the job, read once hora's
driver (which writes what the ranks send) has written what a test waits for."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator

import hora.tensorflow as hvd
from hora.timeline import load_trace


@contextlib.contextmanager
def shared_trace() -> Iterator[str]:
    """A path in a folder of rank 0's, the same on every rank; removed when every rank is done."""
    where = hvd.broadcast_object(tempfile.mkdtemp() if hvd.rank() == 0 else None)
    try:
        yield os.path.join(where, "timeline.json")
    finally:
        hvd.allgather_object(None)  # every rank has read it
        if hvd.rank() == 0:
            shutil.rmtree(where, ignore_errors=True)


def recorded_tracks(path: str, wanted: set[tuple[int, str]], timeout: float = 30.0) -> set:
    """The (rank, track name) pairs in the trace, once all of `wanted` are there (or `timeout`)."""
    deadline = time.monotonic() + timeout
    tracks: set[tuple[int, str]] = set()
    while not wanted <= tracks and time.monotonic() < deadline:
        time.sleep(0.1)
        if os.path.exists(path):
            events = load_trace(path)
            tracks = {
                (e["pid"], e["args"]["name"])
                for e in events
                if e.get("ph") == "M" and e.get("name") == "thread_name"
            }
    return tracks
