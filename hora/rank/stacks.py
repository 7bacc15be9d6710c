"""Where a rank is: every thread's Python stack and the collectives it has in flight, as text.

A hung job's first question is "where is each rank stuck?". The worker answers it on the driver's
request (`DumpStacks`) from its channel-watching thread, which gets the GIL whenever the stuck
thread waits in a collective, a socket or a sleep (they all release it), so no py-spy on every
host is needed. Only the user's code is shown, each frame with the call it waits in (hora's
`allreduce`, a library's): the bootstrap, hora's and the libraries' internals are left out, and
so are threads that run no user code (hora's collective loop, library pools).
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import traceback
from types import FrameType

_HORA_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# The interpreter's own library and the installed packages: frames there are not the user's.
_LIBRARY_DIRS = tuple(
    os.path.abspath(path) + os.sep
    for key in ("stdlib", "platstdlib", "purelib", "platlib")
    if (path := sysconfig.get_paths().get(key))
)
_MAX_FRAMES = 30  # per thread, innermost kept


def _is_users(filename: str) -> bool:
    if filename.startswith("<frozen"):
        return False
    name = os.path.abspath(filename)
    return not (name.startswith(_HORA_DIR) or name.startswith(_LIBRARY_DIRS))


def _user_frames(frame: FrameType) -> list[traceback.FrameSummary]:
    """`frame`'s stack, outermost first: the user's own frames, each followed by the call it
    waits in (hora's `allreduce`, a library's `queue.get`), without what lies under that call."""
    kept: list[traceback.FrameSummary] = []
    caller_is_users = False
    for summary in traceback.extract_stack(frame):
        users = _is_users(summary.filename)
        if users or caller_is_users:
            kept.append(summary)
        caller_is_users = users
    return kept[-_MAX_FRAMES:]


def in_flight() -> list[str]:
    """The collectives this rank has submitted and not seen complete ("allreduce 'grad.w'")."""
    collectives = sys.modules.get("hora.collectives")  # never imported here: a rank that never
    if collectives is None:  # used them has none in flight
        return []
    return list(collectives.in_flight())


def dump(skip: threading.Thread | None = None) -> str:
    """Every thread's stack (but `skip`'s, the asking thread), main thread first."""
    names = {t.ident: t for t in threading.enumerate()}
    frames = sys._current_frames()
    lines: list[str] = []
    pending = in_flight()
    lines.append(
        "in collectives: " + ", ".join(pending) if pending else "in no collective of hora's"
    )
    main = threading.main_thread().ident
    for ident in sorted(frames, key=lambda i: i != main):
        thread = names.get(ident)
        if skip is not None and thread is skip:
            continue
        kept = _user_frames(frames[ident])
        if not kept:
            continue  # hora's own threads, idle pool threads
        name = thread.name if thread is not None else f"thread {ident}"
        lines.append(f"thread {name!r}{' (main)' if ident == main else ''}:")
        lines += [line.rstrip("\n") for line in traceback.format_list(kept)]
    return "\n".join(lines)
