"""Checkpoint: the one place a training state is written to disk and found again.

Restarts after a failure and the Spark estimator's resume both start from `latest()`, so both
rely on the same two promises: a checkpoint is written by one rank only, and a checkpoint that
was not completely written is never returned.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from typing import Any, NamedTuple

from hora import environment
from hora.checkpoint import _format
from hora.storage import Location, is_temp
from hora.wire.link import log_to_driver

_NAME = re.compile(r"^step-(\d+)\.ckpt$")


def _file_name(step: int) -> str:
    return f"step-{step}.ckpt"


class Restored(NamedTuple):
    """A checkpoint read back: the state as saved and the step it was saved at."""

    state: Any
    step: int


class CheckpointLoadError(RuntimeError):
    """Rank 0 could not read the checkpoint that every rank was waiting for."""


def _rank_and_size() -> tuple[int, int]:
    """This process's rank and the world's size, asked when it matters (not at construction).

    hora.torch's answer once it is initialised, else torch.distributed's, else the launcher's
    environment (hora, torchrun and TorchDistributor set RANK, horovodrun HOROVOD_RANK), else a
    world of one. Neither module is imported here: one never imported is not initialised.
    """
    hvd = sys.modules.get("hora.torch")
    if hvd is not None and hvd.is_initialized():
        return hvd.rank(), hvd.size()
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    here = environment.current()
    return here.rank or 0, here.size or 1


def _check_count(name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"Checkpoint {name} must be an int >= {least}, got {value!r}")
    return value


class Checkpoint:
    """A directory of training checkpoints, one file per saved step, the newest `keep` kept.

    `directory` is a local path, a path on a mounted shared filesystem (NFS, /dbfs, ...), a
    `file:` URI, or any URI pyarrow can open (`hdfs://`, `s3://`, ...; pass `filesystem=` a
    configured `pyarrow.fs.FileSystem` to use its credentials). Only rank 0 ever touches it when
    saving or in `load_and_broadcast`, so the other ranks need not see it at all; rank 0 creates
    it and checks that it can write there when the Checkpoint is made.

    One job writes a directory at a time: a save removes temp files that earlier, killed
    writers left behind.
    """

    def __init__(
        self, directory: str | os.PathLike[str], keep: int = 3, *, filesystem: Any = None
    ) -> None:
        self._keep = _check_count("keep", keep, 1)
        self._storage = Location.parse(directory, "Checkpoint directory", filesystem=filesystem)
        if _rank_and_size()[0] == 0:
            self._storage.check_writable()

    @property
    def directory(self) -> str:
        return self._storage.describe()

    @property
    def keep(self) -> int:
        return self._keep

    def __repr__(self) -> str:
        return f"Checkpoint({self.directory!r}, keep={self._keep})"

    def save(self, state: Any, step: int) -> str | None:
        """Write `state` as the checkpoint of `step` on rank 0; its path there, None elsewhere.

        `state` is anything torch.save takes; one dict holding the model's and optimizer's
        state_dict, the epoch or step, RNG states and history resumes everything at once. The
        file appears under its final name only once it is whole; older checkpoints beyond
        `keep` are removed only after that. Other ranks return at once: they may pass the same
        state, and need not be able to see the directory.
        """
        step = _check_count("step", step, 0)
        if _rank_and_size()[0] != 0:
            return None
        name = _file_name(step)
        self._storage.write_atomically(name, lambda out: _format.write(state, step, out))
        self._prune(newest=step)
        return self._storage.describe(name)

    def latest(self, *, weights_only: bool = True, map_location: Any = "cpu") -> Restored | None:
        """The newest whole checkpoint's (state, step), or None when there is none.

        A file that was cut short, never finished or changed after it was written is skipped
        with a warning, and the one before it is tried. `weights_only=True` (torch.load's safe
        mode) reads tensors, containers, numbers, strings and Python's random.getstate(); pass
        False for other objects (a NumPy RNG state) in checkpoints you wrote yourself, since it
        unpickles arbitrary code. Tensors come back on the CPU (`map_location`), so a checkpoint
        saved on GPUs loads on a driver without one; load_state_dict moves them to the model.
        """
        for step in sorted(self._steps(), reverse=True):
            name = _file_name(step)
            try:
                with self._storage.open_read(name) as (f, size):
                    length = _format.verify(f, size, step)
                    state = _format.load(
                        f, length, weights_only=weights_only, map_location=map_location
                    )
            except FileNotFoundError:
                continue  # removed since it was listed
            except _format.DamagedCheckpointError as e:
                warnings.warn(
                    f"hora.checkpoint: skipping {self._storage.describe(name)}: {e}",
                    RuntimeWarning,
                    stacklevel=2,
                )
                continue
            return Restored(state, step)
        return None

    def load_and_broadcast(self, *, weights_only: bool = True) -> Restored | None:
        """`latest()` as read by rank 0, on every rank (all must call it), or None on every rank.

        For hora.torch (after hvd.init()) or torch.distributed jobs: only rank 0 reads, so the
        directory may be one that only rank 0 can see, and the ranks cannot disagree about
        which step they resume from. Tensors arrive on the CPU. If rank 0 cannot read, every
        rank raises instead of waiting for it.
        """
        rank, size = _rank_and_size()
        if size == 1:
            return self._report(self.latest(weights_only=weights_only))
        failure: BaseException | None = None
        message: tuple[str, Any] | None = None
        if rank == 0:
            try:
                message = ("ok", self._report(self.latest(weights_only=weights_only)))
            except Exception as e:
                failure = e
                message = ("error", f"{type(e).__name__}: {e}")
        message = _broadcast_from_rank0(message)
        if failure is not None:
            raise failure
        assert message is not None
        kind, payload = message
        if kind == "error":
            raise CheckpointLoadError(
                f"rank 0 could not read the checkpoint in {self.directory}: {payload}"
            )
        return payload

    def _report(self, found: Restored | None) -> Restored | None:
        """Tell the driver's log where this attempt resumes (rank 0, once per load)."""
        attempt = _attempt_text()
        if found is None:
            log_to_driver(
                f"hora.checkpoint: no checkpoint in {self.directory}{attempt}: from scratch"
            )
        else:
            where = self._storage.describe(_file_name(found.step))
            log_to_driver(
                f"hora.checkpoint: resuming after step {found.step}{attempt}, from {where}"
            )
        return found

    def _steps(self) -> list[int]:
        return [int(m.group(1)) for n in self._storage.names() if (m := _NAME.match(n))]

    def _prune(self, newest: int) -> None:
        """Keep the `keep` newest checkpoints up to `newest`; drop temp files of dead writers.

        Steps above `newest` are left alone: they belong to a run that got further before it
        failed (and may be damaged, which latest() handles), not to this one's history.
        """
        older = sorted((s for s in self._steps() if s <= newest), reverse=True)
        for step in older[self._keep :]:
            self._storage.remove(_file_name(step))
        for name in self._storage.names():
            if is_temp(name):
                self._storage.remove(name)


def _attempt_text() -> str:
    """ " (attempt 2 of 3)" under a run with restarts (hora's max_restarts, torchrun's), else ""."""
    here = environment.current()
    if not here.max_restarts:
        return ""
    return f" (attempt {here.attempt + 1} of {here.max_restarts + 1})"


def _broadcast_from_rank0(message: Any) -> Any:
    hvd = sys.modules.get("hora.torch")
    if hvd is not None and hvd.is_initialized():
        return hvd.broadcast_object(message, root_rank=0, name="hora.checkpoint.load")
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        box = [message]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    raise RuntimeError(
        "Checkpoint.load_and_broadcast() needs the ranks connected: call hvd.init() (hora.torch) "
        "or torch.distributed.init_process_group() on every rank first, or use latest() on "
        "ranks that can all see the directory"
    )
