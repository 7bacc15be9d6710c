"""Starting and stopping the recording on a rank: `HOROVOD_TIMELINE`, `start_timeline`, regions.

Where the events go depends on how the rank was started. Under a hora launcher the rank ships
raw batches to the driver over the job's channel and the driver writes the file where it was
asked to, whatever host the rank runs on. Without one (torchrun, a bare `hvd.init()`), every rank
appends to the file itself under a file lock, so ranks on one host share one file.

Nothing here imports torch at import time: the driver and the CLI import this package too.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import uuid
from collections.abc import Callable
from contextlib import ContextDecorator
from dataclasses import dataclass
from typing import Any

from hora.timeline import hooks
from hora.timeline._events import RankTrack
from hora.timeline._file import TraceFile
from hora.timeline._recorder import BufferRecorder, Flusher, pack
from hora.wire import link
from hora.wire.protocol import TimelineBatch

PATH_VARS = ("HORA_TIMELINE", "HOROVOD_TIMELINE")  # the first one set wins
MARK_CYCLES_VAR = "HOROVOD_TIMELINE_MARK_CYCLES"
DYNAMIC = "DYNAMIC"
_TRUE = ("1", "true", "yes", "on")


def timeline_setting(environ: Any = None) -> str | None:
    """The timeline variable's value (a path or "DYNAMIC"), or None when recording is off."""
    env = os.environ if environ is None else environ
    for name in PATH_VARS:
        value = (env.get(name) or "").strip()
        if value:
            return DYNAMIC if value.upper() == DYNAMIC else value
    return None


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


@dataclass
class _Recording:
    recorder: Any  # BufferRecorder
    flusher: Any  # Flusher
    close: Callable[[], None]
    path: str


_lock = threading.RLock()
_initialized = False
_dynamic = False
_rank = 0
_job = ""
_active: _Recording | None = None


def on_init(rank: int, size: int, group: Any = None) -> None:
    """Called by `hvd.init()` on every rank once the loop runs; starts a static recording.

    Without a hora launcher the ranks first agree on a job id (one broadcast on `group`, hora's
    world group), so that a file left by an earlier run is truncated, not appended to.
    """
    global _initialized, _dynamic, _rank, _job
    setting = timeline_setting()
    with _lock:
        _initialized, _rank = True, rank
        _dynamic = setting == DYNAMIC
    if setting is None:
        return
    if not _under_launcher():
        _job = _agree_job(size, group)
    if setting != DYNAMIC:
        try:
            _start(setting, _flag(MARK_CYCLES_VAR))
        except OSError as exc:  # a timeline never stops training
            print(f"hora: rank {rank}: not recording the timeline: {exc}", file=sys.stderr)


def on_shutdown() -> None:
    """Called by `hvd.shutdown()`: the recording ends and its last events are written."""
    global _initialized
    stop_timeline()
    with _lock:
        _initialized = False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Record this rank's collectives into `file_path` (needs `HOROVOD_TIMELINE=DYNAMIC`).

    A recording already running is stopped first. Every rank that should appear in the trace
    calls it; ranks writing the same path share one file.
    """
    with _lock:
        if not _initialized:
            raise ValueError("Horovod has not been initialized; use hvd.init().")
        if not _dynamic:
            raise ValueError(
                "Set HOROVOD_TIMELINE=DYNAMIC (before hvd.init(), or on the driver) to use "
                "start_timeline()/stop_timeline()."
            )
        stop_timeline()
        _start(os.fspath(file_path), bool(mark_cycles))


def stop_timeline() -> None:
    """Stop recording and write what was recorded; does nothing when no recording runs."""
    global _active
    with _lock:
        rec, _active = _active, None
    if rec is None:
        return
    if hooks.recorder is rec.recorder:
        hooks.set_recorder(None)
    driver = link.current()
    if driver is not None:
        with contextlib.suppress(ValueError):
            driver.before_detach.remove(stop_timeline)
    rec.recorder.stop_marker()
    rec.flusher.close()
    rec.close()


def active_path() -> str | None:
    """The file being recorded to on this rank, if any."""
    rec = _active
    return rec.path if rec is not None else None


class timeline_context(ContextDecorator):  # lower case: used like a function, as in Horovod
    """Mark a region of user code (`with hvd.timeline_context("forward"):` or as a decorator).

    Regions show on their own track per thread, above the rank's collectives, so the trace
    shows communication against compute. Costs one attribute read when no recording runs.
    """

    def __init__(self, name: str) -> None:
        self.name = str(name)

    def __enter__(self) -> timeline_context:
        rec = _active
        if rec is not None:
            rec.recorder.region("B", self.name)
        return self

    def __exit__(self, *exc: object) -> None:
        rec = _active
        if rec is not None:
            rec.recorder.region("E", self.name)


# -- internals ------------------------------------------------------------------------------
def _under_launcher() -> bool:
    return link.current() is not None


def _agree_job(size: int, group: Any) -> str:
    job = uuid.uuid4().hex
    if size > 1 and group is not None:
        import torch.distributed as dist

        box = [job]
        dist.broadcast_object_list(box, src=0, group=group)
        job = str(box[0])
    return job


def _start(path: str, mark_cycles: bool) -> None:
    global _active
    recorder = BufferRecorder(mark_cycles)
    driver = link.current()
    if driver is not None:
        rank = _rank

        def ship(batch: list[Any]) -> None:
            with contextlib.suppress(OSError):  # the driver is gone: nobody will read it
                driver.send(TimelineBatch(rank, path, pack(batch)))

        flusher = Flusher(recorder, ship)
        recording = _Recording(recorder, flusher, lambda: None, path)
        # The job's result closes the channel: ship the rest before it goes.
        driver.before_detach.append(stop_timeline)
    else:
        trace = TraceFile(path, _job or uuid.uuid4().hex, shared=True)
        track = RankTrack(_rank)

        def write(batch: list[Any]) -> None:
            trace.append(track.convert(batch))

        flusher = Flusher(recorder, write)
        recording = _Recording(recorder, flusher, trace.close, os.path.abspath(path))
    with _lock:
        _active = recording
    hooks.set_recorder(recorder)
