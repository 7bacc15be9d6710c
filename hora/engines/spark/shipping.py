"""hora on the executors without installing it: its zip goes with the session.

A classic session takes it as a Python file (`SparkContext.addPyFile`), a Spark Connect session as
an artifact (`addArtifacts(..., pyfile=True)`); either way every Python worker of the session has
it first on `sys.path`, so the entry's check then finds the driver's own hora, and the rank's
supervisor hands the zip on to the rank's interpreter (`hora.engines.rank_pythonpath`). A zip
goes once per session: its name carries the hash of hora's files.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

from hora import engines
from hora.engines.spark.base import Session

_LOCK = threading.Lock()
_SHIPPED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def ship_hora(session: Session) -> None:
    """Add this hora's zip to `session`'s Python files (once per session and build)."""
    path = engines.hora_zip()
    handle: Any = getattr(session, "sc", None) or getattr(session, "spark", None)
    with _LOCK:
        done = _SHIPPED.setdefault(handle, set())
        if os.path.basename(path) in done:
            return
        if session.kind == "connect":
            handle.addArtifacts(path, pyfile=True)
        else:
            handle.addPyFile(path)
        done.add(os.path.basename(path))
