"""hora.tensorflow and hora.tensorflow.keras on 3 real ranks (`session.SIZES`), launched by
hora.run.

TensorFlow's import costs seconds per process, so one job (conftest.py, shared with the
Horovod-style session) runs every case of `_cases` inside the ranks, and each test below
asserts one case on every rank.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

from tests.tensorflow import _cases
from tests.tensorflow.horovod_session import session

REPO = Path(__file__).resolve().parents[2]
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2"}


@pytest.fixture(scope="module")
def outcomes(tf_jobs: dict[int, list[dict]]) -> dict[int, list[dict[str, str]]]:
    return {np: [rank["cases"] for rank in ranks] for np, ranks in tf_jobs.items()}


@pytest.mark.parametrize("np", session.SIZES)
@pytest.mark.parametrize("case", list(_cases.CASES))
def test_case(outcomes: dict[int, list[dict[str, str]]], case: str, np: int) -> None:
    per_rank = outcomes[np]
    assert len(per_rank) == np
    failures = {r: o[case] for r, o in enumerate(per_rank) if o.get(case) != "ok"}
    assert not failures, "\n".join(f"rank {r}: {text}" for r, text in failures.items())


def test_importing_hora_does_not_import_tensorflow() -> None:
    code = (
        "import sys, hora, hora.torch, hora.spark, hora.collectives; "
        "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, **QUIET},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
