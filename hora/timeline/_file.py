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
# A write is cut short by SIGKILL mostly between pages (the kernel checks for a fatal signal before
# copying each page). Appends are therefore split into writes that stay within a page, or cross
# one boundary with a single byte before it, so that such a cut leaves the file ending in `,`.
# Rarely a cut lands inside a page (once in CI, 15 bytes into a write, on a loaded host): the
# file then ends in a torn event. The summary reads either, keeping every complete event; a
# viewer needs the file cut after the last complete event and closed with `]`. No sequence of
# writes can grow a JSON value across a page with no window at all: after a complete value only
# whitespace may follow.
PIECE_BYTES = 4096  # the page size: what the kernel writes without a check for signals


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
        """Add `events` (JSON object texts), each piece of them replacing the closing bracket."""
        events = list(events)
        if not events:
            return
        with self._locked():
            fd = self._fd
            if fd is None:
                raise ValueError(f"timeline file {self.path} is closed")
            end = os.fstat(fd).st_size
            if end == 0 or os.pread(fd, 1, end - 1) != b"]":
                raise OSError(f"timeline file {self.path} was changed by someone else")
            for offset, data in _pieces(events, end - 1):
                os.pwrite(fd, data, offset)

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


def _pieces(events: Iterable[str], pos: int) -> list[tuple[int, bytes]]:
    """(offset, bytes) writes that append `events` when the closing bracket is at `pos`.

    Each write replaces the bracket and ends with a new one. A write that must cross into the
    next page starts on the last byte of its page (the one before it pads with spaces, valid
    JSON), so the part a SIGKILL can tear off leaves at most that one byte behind.
    """
    writes: list[tuple[int, bytes]] = []
    current: list[bytes] = []
    start = pos  # where the piece being built will be written
    size = 2  # b"\n]" plus, per event, its b",\n" and text

    def flush(pad_to: int | None = None) -> None:
        nonlocal current, start, size
        body = b"".join(b",\n" + d for d in current)
        tail = b"\n]" if pad_to is None else b" " * (pad_to - start - len(body) - 1) + b"]"
        writes.append((start, body + tail))
        start += len(body) + len(tail) - 1
        current, size = [], 2

    for text in events:
        data = text.encode()
        page_end = (start // PIECE_BYTES + 1) * PIECE_BYTES
        if start + size + len(data) + 2 > page_end and start != page_end - 1:
            flush(pad_to=page_end)  # fill this page; the bracket moves to its last byte
            page_end += PIECE_BYTES
        elif start + size + len(data) + 2 > page_end + PIECE_BYTES and current:
            flush()  # do not cross a second page boundary
        current.append(data)
        size += len(data) + 2
    if current:
        flush()
    return writes
