"""Where an estimator keeps its files: one root, a fixed layout, any place `hora.storage` opens.

    <store>/data/<fingerprint>/train, .../validation    the DataFrame as Parquet, written once
    <store>/runs/<run_id>/checkpoints/                    one hora.checkpoint file per epoch
    <store>/runs/<run_id>/logs/                           TensorBoard event files (rank 0)
    <store>/runs/<run_id>/model/                          the final model, for use outside Spark

The root is parsed, refused and opened by `hora.storage.Location`: Spark writes the Parquet
through its own filesystems and the ranks read it through pyarrow's, at the same place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hora.storage import Location


@dataclass(frozen=True)
class Store(Location):
    """A store root with the estimator's layout."""

    @classmethod
    def parse(cls, place: str | os.PathLike[str], what: str = "store") -> Store:
        location = Location.parse(place, what)
        return cls(location.uri, location.local, location.what)

    def data(self, key: str, split: str) -> str:
        return self.path("data", key, split)

    def run(self, run_id: str, *parts: str) -> str:
        return self.path("runs", run_id, *parts)

    def run_location(self, run_id: str, *parts: str) -> str:
        return self.location("runs", run_id, *parts)
