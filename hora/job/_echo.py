"""A rank's output on the driver's terminal, each line behind its `[rank]` prefix.

A line that ends with "\r" (a progress bar redrawing itself, as the worker's pump passes it on)
is drawn as tqdm draws it, from the start of the terminal's line and left open, so the next
redraw replaces it, prefix included. Whatever follows on the same stream from another rank
starts on a line of its own rather than over the bar.
"""

from __future__ import annotations

from typing import TextIO

_open: dict[int, str] = {}  # id(stream) -> the prefix of the line left open there by a redraw


def echo(prefix: str, text: str, out: TextIO) -> None:
    """Print `text` (a line without its "\n", or a redraw ending with "\r") after `prefix`."""
    left_open = _open.pop(id(out), None)
    redraw = text.endswith("\r")
    if left_open is not None and left_open != prefix:
        start = "\n"  # another rank's bar stays as it was drawn last
    else:
        start = "\r" if redraw or left_open is not None else ""
    if redraw:
        out.write(f"{start}{prefix}{text[:-1]}")
        _open[id(out)] = prefix
    else:
        out.write(f"{start}{prefix}{text}\n")
    out.flush()
