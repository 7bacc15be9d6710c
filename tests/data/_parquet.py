"""Small Parquet datasets written with pyarrow, and a world of loaders stepped in one process."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs

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


class _Slow(fs.FileSystemHandler):
    """The local filesystem, each call after `seconds` (see `slow_files`)."""

    def __init__(self, seconds: float, calls: list[int] | None) -> None:
        self.local = fs.LocalFileSystem()
        self.seconds = seconds
        self.calls = calls
        self.under_way = 0
        self.lock = threading.Lock()

    def waited(self, call: Any, argument: Any) -> Any:
        with self.lock:
            self.under_way += 1
            if self.calls is not None:
                self.calls.append(self.under_way)
        try:
            time.sleep(self.seconds)
            return call(argument)
        finally:
            with self.lock:
                self.under_way -= 1

    def unused(self, *args: Any) -> Any:
        raise NotImplementedError("not a footer's call")

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = unused
    delete_file = move = copy_file = open_output_stream = open_append_stream = unused

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    __hash__ = object.__hash__

    def get_type_name(self) -> str:
        return "slow"

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: Any) -> Any:
        return self.waited(self.local.get_file_info, paths)

    def get_file_info_selector(self, selector: Any) -> Any:
        return self.waited(self.local.get_file_info, selector)

    def open_input_file(self, path: str) -> Any:
        return self.waited(self.local.open_input_file, path)

    def open_input_stream(self, path: str) -> Any:
        return self.open_input_file(path)


def slow_files(seconds: float, calls: list[int] | None = None) -> fs.PyFileSystem:
    """The local filesystem as a pyarrow filesystem whose every call first waits `seconds`: the
    round trip an object store adds to each footer's read. `calls`, when given, gets the
    number of calls under way as each starts. What footers never call is refused."""
    return fs.PyFileSystem(_Slow(seconds, calls))
