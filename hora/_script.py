"""Run a Python script as `__main__` inside a worker, as `python script.py args...` would."""

from __future__ import annotations

import os
import runpy
import sys


def run_script(path: str, argv: list[str]) -> None:
    """Execute `path` with `sys.argv = [path, *argv]` and its folder first on `sys.path`."""
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(path))
    runpy.run_path(path, run_name="__main__")


def check_script(path: str) -> str:
    """The script's absolute path; raises before launch if it cannot be run."""
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise FileNotFoundError(f"no such script: {path!r} (looked for {full})")
    return full
