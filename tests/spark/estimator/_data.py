"""Real data and small models for the estimator's tests: scikit-learn's digits, no download.

Models are torch's own modules (nn.Sequential), so the executors' Python workers that run
TorchModel.transform can unpickle them without importing the tests.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from hora.spark import TorchEstimator


def digits_rows(limit: int | None = None) -> tuple[list[list[float]], list[int]]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).tolist()
    y = digits.target.tolist()
    return (x[:limit], y[:limit]) if limit else (x, y)


def digits_as_columns(spark, limit: int | None = None):
    """64 double pixel columns p0..p63 and a long `label`: what VectorAssembler assembles."""
    x, y = digits_rows(limit)
    names = [f"p{i}" for i in range(64)]
    schema = ", ".join(f"{n} double" for n in names) + ", label long"
    return spark.createDataFrame(
        [[*row, label] for row, label in zip(x, y, strict=True)], schema
    ), names


def digits_as_array(spark, limit: int | None = None):
    """`features` array<double>, `label` long, and `is_val` (every fifth row)."""
    x, y = digits_rows(limit)
    rows = [(row, label, i % 5 == 0) for i, (row, label) in enumerate(zip(x, y, strict=True))]
    return _in_the_jvm(
        spark.createDataFrame(rows, "features array<double>, label long, is_val boolean")
    )


def _in_the_jvm(df):
    """Cached once, so the tests' many small jobs do not start Python workers to re-read it."""
    df = df.cache()
    df.count()
    return df


def mlp(seed: int = 0, dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(64, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 10)
    )  # fmt: skip


def estimator(root: str | os.PathLike[str], **kwargs: Any) -> TorchEstimator:
    """A TorchEstimator of `mlp` on the digits' `features` and `label`, its store at `root`;
    `kwargs` override any setting (`store` too)."""
    model = kwargs.pop("model", None) or mlp()
    settings = {
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        "loss": nn.functional.cross_entropy,
        "feature_cols": ["features"],
        "label_cols": ["label"],
        "batch_size": 32,
        "epochs": 2,
        "store": str(root),
        "num_proc": 2,
        "random_seed": 7,
    }
    return TorchEstimator(**settings | kwargs)


def accuracy(output: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    return (output.argmax(1) == label).float().mean()


class FailAt:
    """A callback that makes one rank raise when an epoch begins: a run stopped mid-way."""

    def __init__(self, rank: int, epoch: int) -> None:
        self.rank, self.epoch = rank, epoch

    def on_epoch_begin(self, epoch: int) -> None:
        import hora.torch as hvd

        if hvd.rank() == self.rank and epoch == self.epoch:
            raise RuntimeError(f"stopped on purpose at epoch {epoch}")


class Record:
    """A callback that writes what it was told to a folder, one file per rank and event."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        import json
        import os

        import hora.torch as hvd

        with open(os.path.join(self.folder, f"{hvd.rank()}-{epoch}.json"), "w") as f:
            json.dump(logs, f)
