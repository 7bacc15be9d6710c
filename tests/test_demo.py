"""The demo is the project's main job: it must really learn, on both engines."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _demo(spark: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "examples/digits.py", "--spark", spark],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _accuracies(out: str) -> list[float]:
    return [
        float(line.rsplit(" ", 1)[1])
        for line in out.splitlines()
        if line.startswith("driver:") and "held-out accuracy" in line
    ]


def test_demo_reaches_95_percent_on_two_local_ranks():
    done = _demo("no")
    assert done.returncode == 0, done.stdout + done.stderr
    (accuracy,) = _accuracies(done.stdout)
    assert accuracy >= 0.95
    assert "[0] held-out accuracy" in done.stdout  # rank 0's own report, relayed live


@pytest.mark.spark
def test_demo_reaches_95_percent_on_spark_too():
    pytest.importorskip("pyspark")
    done = _demo("yes")
    assert done.returncode == 0, done.stdout + done.stderr
    local, on_spark = _accuracies(done.stdout)
    assert local >= 0.95 and on_spark >= 0.95
