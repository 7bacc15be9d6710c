"""The torchvision stand-in's folder, put first where Mosaic Streaming will be imported."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

STUBS = Path(__file__).resolve().parent / "_stubs"


def python_path(current: str | None) -> str:
    """`current` (a PYTHONPATH, or None) with the stand-in's folder first."""
    return os.pathsep.join([str(STUBS), *([current] if current else [])])


def put_first(patch: pytest.MonkeyPatch) -> None:
    """This process imports the stand-in, and so does every process started after this call
    (Spark's JVM and its Python workers, hora's ranks) through PYTHONPATH; undone with `patch`."""
    patch.syspath_prepend(str(STUBS))
    patch.setenv("PYTHONPATH", python_path(os.environ.get("PYTHONPATH")))
    if "torchvision" in sys.modules and not sys.modules["torchvision"].__file__.startswith(
        str(STUBS)
    ):
        raise RuntimeError("a real torchvision is already imported in this process")


def forget() -> None:
    """Drop the stand-in from this process's modules, once its path is gone: a later import of
    torchvision (torcheval's, in the Spark ML tests) must find the real one or none."""
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "torchvision" and str(getattr(module, "__file__", "")).startswith(
            str(STUBS)
        ):
            del sys.modules[name]
