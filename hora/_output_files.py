"""horovodrun's `--output-filename DIR`: every rank's output also lands in its own files.

The driver writes them as the lines arrive (so Spark executors' output lands on the driver too):
`DIR/rank.<rank>/stdout` and `DIR/rank.<rank>/stderr`, the rank zero-padded as horovodrun pads it
so that the folders sort in rank order. The lines are written as the rank printed them, without
the `[rank]` marker of the terminal; `log_to_driver` messages go to stdout.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TextIO


class OutputFiles:
    """The open files of one run, created before anything is launched."""

    def __init__(self, folder: str, np: int):
        width = len(str(np - 1))
        self.folder = folder
        self._files: list[tuple[TextIO, TextIO]] = []
        self._broken = False
        try:
            for rank in range(np):
                rank_dir = os.path.join(folder, f"rank.{str(rank).zfill(width)}")
                os.makedirs(rank_dir, exist_ok=True)
                out = open(os.path.join(rank_dir, "stdout"), "w", buffering=1)  # noqa: SIM115
                try:
                    err = open(os.path.join(rank_dir, "stderr"), "w", buffering=1)  # noqa: SIM115
                except OSError:
                    out.close()
                    raise
                self._files.append((out, err))
        except OSError as exc:
            self.close()
            raise ValueError(
                f"cannot write the ranks' output under output_filename={folder!r}: {exc}"
            ) from exc

    def write(self, rank: int, stream: str, line: str) -> None:
        if self._broken or not 0 <= rank < len(self._files):
            return
        out, err = self._files[rank]
        try:
            # a redraw (a progress bar's "\r") stays one, as the rank printed it
            (err if stream == "stderr" else out).write(line if line.endswith("\r") else line + "\n")
        except OSError as exc:  # a full disk must not stop the training
            self._broken = True
            print(f"hora: stopped writing output files to {self.folder}: {exc}", file=sys.stderr)

    def close(self) -> None:
        for pair in self._files:
            for f in pair:
                with contextlib.suppress(OSError):
                    f.close()
        self._files = []
