"""Where an estimator keeps its files: one root, a `hora.storage.Location`, in a fixed layout.

    <store>/data/                       the DataFrame as Parquet, written by hora.data.from_spark
    <store>/runs/<run_id>/checkpoints/  one hora.checkpoint file per epoch
    <store>/runs/<run_id>/logs/         TensorBoard event files (rank 0)
    <store>/runs/<run_id>/model/        the final model, for use outside Spark

The store is no face of its own: `hora.storage` parses, refuses, lists, reads and writes it
(Spark writes the Parquet through its own filesystems, the ranks read it through pyarrow's, at
the same place); this module only names the layout.
"""

from __future__ import annotations

import os

from hora.storage import Location

CHECKPOINTS = "checkpoints"
LOGS = "logs"
MODEL = "model"


def open_store(place: str | os.PathLike[str]) -> Location:
    """The store a user named; a ValueError says what to write instead."""
    return Location.parse(place, "store")


def run_folder(store: Location, run_id: str) -> Location:
    """The folder of one run: its checkpoints, event files and exported model."""
    return store.child("runs", run_id)
