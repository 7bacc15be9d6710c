"""TensorBoard event files for a run, written by rank 0 with torch's SummaryWriter: every
epoch's training and validation loss and metrics, under `<store>/runs/<run_id>/logs/`.

A store that is not a local directory gets the files written locally first and copied there
after every epoch, since SummaryWriter writes only through the local filesystem here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from typing import Any

from hora.spark.estimator.store import LOGS
from hora.storage import Location


class EpochEvents:
    def __init__(self, run: Location) -> None:
        self._run = run
        self._writer: Any = None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # tensorboard is an extra; training goes on without it
            warnings.warn(
                f"hora: no TensorBoard event files ({e}); pip install tensorboard",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        if run.is_local:
            self._local = run.location(LOGS)
            self._temp = None
        else:
            self._temp = tempfile.mkdtemp(prefix="hora-events-")
            self._local = self._temp
        os.makedirs(self._local, exist_ok=True)
        self._writer = SummaryWriter(log_dir=self._local)

    def write(self, epoch: int, logs: dict[str, float]) -> None:
        """One scalar per value, at step `epoch + 1` (the number of epochs done)."""
        if self._writer is None:
            return
        for name, value in logs.items():
            self._writer.add_scalar(_tag(name), value, epoch + 1)
        self._writer.flush()
        self._upload()

    def close(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self._upload()
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)

    def _upload(self) -> None:
        if self._temp is None:
            return
        for name in os.listdir(self._temp):
            with open(os.path.join(self._temp, name), "rb") as f:
                self._run.write_bytes(f"{LOGS}/{name}", f.read())


def _tag(name: str) -> str:
    """`val_accuracy` -> `validation/accuracy`, `loss` -> `train/loss`."""
    if name.startswith("val_"):
        return f"validation/{name[4:]}"
    return f"train/{name}"
