"""The commit store of a hora run: hvd.elastic's commits outlive the ranks that made them.

Horovod's elastic survivors keep their committed state in memory. Under hora a lost rank ends
its attempt, and on Spark a failed barrier stage takes every task down, survivors included, so
an in-memory commit would die with them. Each commit is therefore also written by the host's
local rank 0 (after a commit every rank holds the same state) to a file that outlives the
processes: in the host's shared memory (/dev/shm, a tmpfs: no disk; the temp folder where there
is none), `hora-elastic-<uid>/<run id>/commit.pt`, replaced atomically by `hora.storage`'s one
writer (written beside it, then renamed, so a rank killed mid-write leaves the previous commit
whole). It holds the commit's number, how many ranks made it, and the state. A new attempt's
ranks read their hosts' files and restore the freshest (`hora.collectives.elastic`).

The files of a run are removed when it ends, by its last ranks (every host they ran on) and by
the driver (its own host); a host that left the run keeps its file until a later run on it
removes folders older than a day.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from hora.storage import Location

SHARED_MEMORY = "/dev/shm"
STALE_SECONDS = 24 * 3600.0
FILE_NAME = "commit.pt"


class Commit(NamedTuple):
    """One committed state: the `number`-th commit of the run, made by `size` ranks."""

    number: int
    size: int
    state: Any


def _root() -> Path:
    """This user's folder of commit stores: in shared memory where the host has it."""
    base = SHARED_MEMORY if os.access(SHARED_MEMORY, os.W_OK) else tempfile.gettempdir()
    return Path(base) / f"hora-elastic-{os.getuid()}"


class CommitStore:
    """The commits of run `run_id` on this host."""

    def __init__(self, run_id: str):
        self.folder = _root() / run_id
        self._place = Location.parse(self.folder, "commit store")

    @property
    def path(self) -> Path:
        return self.folder / FILE_NAME

    def write(self, commit: Commit) -> None:
        """Replace this host's commit with `commit`, atomically."""
        import torch  # here: the driver imports this package without torch

        self.folder.parent.mkdir(exist_ok=True, mode=0o700)  # this user's, private
        self.folder.mkdir(exist_ok=True, mode=0o700)
        saved = {"number": commit.number, "size": commit.size, "state": commit.state}
        self._place.write_atomically(FILE_NAME, lambda out: torch.save(saved, out))

    def read(self) -> Commit | None:
        """This host's latest commit of the run, or None."""
        import torch

        try:
            with self._place.open_read(FILE_NAME) as (f, _):
                data = torch.load(f, map_location="cpu", weights_only=False)  # our own file
        except FileNotFoundError:
            return None
        return Commit(int(data["number"]), int(data["size"]), data["state"])

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self._place.remove_tree()
        with contextlib.suppress(OSError):
            self.folder.parent.rmdir()  # only when no other run of this user keeps commits


def remove_host_commits(run_id: str) -> None:
    """Remove run `run_id`'s commits on this host (the run is over)."""
    CommitStore(run_id).remove()


def remove_stale_commits(now: float | None = None) -> None:
    """Remove the commit stores of runs that ended (or died) more than a day ago."""
    now = time.time() if now is None else now
    root = _root()
    with contextlib.suppress(OSError):
        for folder in root.iterdir():
            with contextlib.suppress(OSError):
                if now - folder.stat().st_mtime > STALE_SECONDS:
                    shutil.rmtree(folder, ignore_errors=True)
