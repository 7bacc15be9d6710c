"""Small Parquet datasets written with pyarrow, and a world of loaders stepped in one process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import hora.data


def write_ids(folder: Path, files: int = 3, rows: int = 200, group: int = 32) -> hora.data.Dataset:
    """`files` files of `rows` rows (row groups of `group`): an id column, a 3-vector, text."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        ids = np.arange(f * rows, (f + 1) * rows)
        table = pa.table(
            {
                "id": ids,
                "x": pa.array([[float(i), 1.0, 2.0] for i in ids], pa.list_(pa.float32())),
                "text": [f"row {i}" for i in ids],
            }
        )
        pq.write_table(table, folder / f"part-{f}.parquet", row_group_size=group)
    return hora.data.from_parquet(folder)


def step_world(loaders: list[Any], steps: int | None = None) -> list[list[int]]:
    """Step every rank's loader in lockstep (at most `steps` batches); each rank's ids."""
    iterators = [iter(loader) for loader in loaders]
    seen: list[list[int]] = [[] for _ in loaders]
    done = 0
    while steps is None or done < steps:
        batches = [next(it, None) for it in iterators]
        ended = [b is None for b in batches]
        assert len(set(ended)) == 1, f"ranks out of lockstep: {ended}"
        if ended[0]:
            break
        for r, batch in enumerate(batches):
            seen[r] += batch["id"].tolist()
        done += 1
    return seen
