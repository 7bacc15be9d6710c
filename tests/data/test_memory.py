"""A shard 8x larger than the prefetch budget trains with peak RSS within the budget plus a stated
constant (DECODE_SLACK: one batch in torch, the reader's current row group, allocator slack)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
PREFETCH = 16 * MiB
DECODE_SLACK = 32 * MiB  # the constant docs/data.md states


def test_a_shard_larger_than_the_budget_streams_within_it(tmp_path):
    rows, width = 128 * 1024, 256  # 128 MiB of float32: 8x the budget
    values = np.random.default_rng(0).random((rows, width), dtype=np.float32)
    column = pa.ListArray.from_arrays(np.arange(0, rows * width + 1, width), values.ravel())
    pq.write_table(pa.table({"x": column}), tmp_path / "big.parquet", row_group_size=2048)
    del values, column
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run(
        [sys.executable, "-m", "tests.data._rss", str(tmp_path / "big.parquet"), str(PREFETCH)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["rows"] == rows
    grown = found["after"] - found["before"]
    assert grown <= PREFETCH + DECODE_SLACK, f"peak RSS grew {grown / MiB:.0f} MiB"
