"""One batch's last step, from Arrow rows to what the loop gets: columns to numpy, then the
user's `transform`. The loader runs it in its training thread or in its worker processes: one
function, so that both give the same batches, bit for bit."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from hora.data._columns import Column, to_numpy

Transform = Callable[[dict[str, Any]], Mapping[str, Any]]


@dataclass(frozen=True)
class BatchMaker:
    """Turns a batch's Arrow table into the dict the loop gets (numpy arrays, lists, or what
    `transform` returns)."""

    columns: Mapping[str, Column]
    pad: Mapping[str, int] = field(default_factory=dict)
    transform: Transform | None = None

    def __call__(self, table: pa.Table) -> dict[str, Any]:
        arrays = to_numpy(table, self.columns, self.pad)
        if self.transform is not None:
            arrays = dict(self.transform(arrays))
        return arrays
