"""The seam for the timeline: every phase of every collective is reported to one recorder.

The collective loop (hora.collectives) reports here; it sits below the timeline and imports
only this module, which imports nothing of hora. The default recorder is disabled, and the loop
checks `recorder.enabled` before building any argument, so a loop without a timeline pays one
attribute lookup per phase. The timeline's writer (`_recorder.BufferRecorder`) subclasses
`Recorder`, sets `enabled = True` and installs itself with `set_recorder` (`_control`).

Phases, as Horovod names them: `NEGOTIATE_<KIND>` (submission until every rank is ready), then
the operation `<KIND>` which nests `QUEUE`, `MEMCPY_IN_FUSION_BUFFER`, the transport call
(`GLOO_<KIND>` or `NCCL_<KIND>`) and `MEMCPY_OUT_FUSION_BUFFER`.
"""

from __future__ import annotations

from typing import Any


class Recorder:
    """Receives phase boundaries; this base class ignores them all."""

    enabled: bool = False

    def begin(self, name: str, phase: str, args: dict[str, Any] | None = None) -> None:
        """`phase` starts for the tensor `name` (on the loop's thread or the caller's)."""

    def end(self, name: str, phase: str, args: dict[str, Any] | None = None) -> None:
        """`phase` ends for `name`; `args` carries dtype, shape and bytes on the operation's end."""

    def cycle(self) -> None:
        """A negotiation round starts (Horovod's `CYCLE_START` marker)."""


NULL_RECORDER = Recorder()
recorder: Recorder = NULL_RECORDER


def set_recorder(new: Recorder | None) -> Recorder:
    """Install `new` (None restores the disabled default); returns the previous recorder."""
    global recorder
    previous = recorder
    recorder = new if new is not None else NULL_RECORDER
    return previous


def begin_each(names: list[str], phase: str) -> None:
    """`phase` starts for every tensor of a bucket (nothing is done while recording is off)."""
    rec = recorder
    if rec.enabled:
        for name in names:
            rec.begin(name, phase)


def end_each(names: list[str], phase: str) -> None:
    """`phase` ends for every tensor of a bucket (nothing is done while recording is off)."""
    rec = recorder
    if rec.enabled:
        for name in names:
            rec.end(name, phase)
