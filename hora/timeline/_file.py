"""The trace file: a JSON array that is valid JSON after every write.

The file always ends in `]`. An append overwrites that bracket with `,<events>]` in one `pwrite`,
under a lock (an flock when several processes share the file), so a reader, or a run killed
between two writes, always finds a complete array. The first element is a header naming the job
that owns the file: a rank of another job truncates it instead of appending to a stale trace.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Iterable

HEADER_NAME = "hora_timeline"
_HEAD_BYTES = 512


def header(job: str) -> str:
    """A metadata event viewers ignore; it says which job owns the file."""
    return json.dumps(
        {"name": HEADER_NAME, "ph": "M", "pid": 0, "tid": 0, "args": {"job": job, "version": 1}},
        separators=(",", ":"),
    )


def _job_of(head: bytes) -> str | None:
    """The job id in a file's first bytes, or None for an empty or foreign file."""
    line = head.split(b"\n", 2)
    if len(line) < 2 or line[0] != b"[":
        return None
    try:
        first = json.loads(line[1].rstrip(b",").decode())
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(first, dict) and first.get("name") == HEADER_NAME:
        return str(first.get("args", {}).get("job"))
    return None


class TraceFile:
    """Appends batches of JSON event texts to `path`, keeping the file one valid JSON array.

    `shared=True` takes an exclusive flock around every write (ranks of one host writing one
    file); `job` then decides whether an existing file is ours (append) or stale (truncate).
    """

    def __init__(self, path: str, job: str, shared: bool = False) -> None:
        self.path = os.path.abspath(path)
        self._shared = shared
        self._lock = threading.Lock()
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        with self._locked():
            head = os.pread(self._fd, _HEAD_BYTES, 0)
            if not shared or _job_of(head) != job:
                os.ftruncate(self._fd, 0)
                os.pwrite(self._fd, ("[\n" + header(job) + "\n]").encode(), 0)

    def append(self, events: Iterable[str]) -> None:
        """Add `events` (JSON object texts) in one write, replacing the closing bracket."""
        body = ",\n".join(events)
        if not body:
            return
        data = (",\n" + body + "\n]").encode()
        with self._locked():
            fd = self._fd
            if fd is None:
                raise ValueError(f"timeline file {self.path} is closed")
            end = os.fstat(fd).st_size
            if end == 0 or os.pread(fd, 1, end - 1) != b"]":
                raise OSError(f"timeline file {self.path} was changed by someone else")
            os.pwrite(fd, data, end - 1)

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _locked(self) -> _Locked:
        return _Locked(self._lock, self._fd if self._shared else None)


class _Locked:
    """The thread lock, plus the file lock when the file is shared between processes."""

    def __init__(self, lock: threading.Lock, fd: int | None) -> None:
        self._lock, self._fd = lock, fd

    def __enter__(self) -> None:
        self._lock.acquire()
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._lock.release()
