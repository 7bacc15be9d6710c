"""hora.tensorflow and hora.tensorflow.keras on real ranks (2 and 3), launched by hora.run.

TensorFlow's import costs seconds per process, so one job per world size runs every case of
`_cases` inside the ranks (the 2-rank one with a timeline on), and each test below asserts one
case on every rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

import hora
from tests.tensorflow import _cases

SIZES = (2, 3)
REPO = Path(__file__).resolve().parents[2]
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2"}


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("timeline") / "trace.json"


@pytest.fixture(scope="module")
def outcomes(traces: Path) -> dict[int, list[dict[str, str]]]:
    return {
        np: hora.run(
            _cases.run_all,
            np=np,
            env={**QUIET, **({"HOROVOD_TIMELINE": str(traces)} if np == 2 else {})},
        )
        for np in SIZES
    }


@pytest.mark.parametrize("np", SIZES)
@pytest.mark.parametrize("case", list(_cases.CASES))
def test_case(outcomes: dict[int, list[dict[str, str]]], case: str, np: int) -> None:
    per_rank = outcomes[np]
    assert len(per_rank) == np
    failures = {r: o[case] for r, o in enumerate(per_rank) if o.get(case) != "ok"}
    assert not failures, "\n".join(f"rank {r}: {text}" for r, text in failures.items())


def test_timeline_records_tf_collectives(
    outcomes: dict[int, list[dict[str, str]]], traces: Path
) -> None:
    events = json.loads(traces.read_text())
    tracks = {
        (e["pid"], e["args"]["name"])
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    for rank in (0, 1):
        assert (rank, "allreduce.tf.probe") in tracks, sorted(tracks)
        assert (rank, "allgather.tf.probe.graph") in tracks, sorted(tracks)


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
