"""TorchEstimator on `local-cluster[2,1,1024]`: two executor JVMs, so the two ranks and the
store's readers are separate processes on separate executors, as on a real cluster."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from hora.spark import TorchEstimator, TorchModel
from tests.spark.conftest import start_spark, stop_spark
from tests.spark.estimator import _data

# a hang guard, not a speed limit: a fit is a few Spark jobs and a launch, slow on a loaded host
pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def spark():
    session = start_spark("local-cluster[2,1,1024]")
    yield session
    stop_spark(session)


def test_fit_transform_save_load_on_two_executors(spark, tmp_path):
    df = _data.digits_as_array(spark, limit=900)
    model = _data.mlp()
    estimator = TorchEstimator(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        loss=nn.functional.cross_entropy,
        metrics=[_data.accuracy],
        feature_cols=["features"],
        label_cols=["label"],
        validation="is_val",
        epochs=3,
        num_proc=2,
        store=f"file://{tmp_path / 'store'}",  # a file: URI works as a path does
        random_seed=1,
    )
    fitted = estimator.fit(df)
    history = fitted.getHistory()
    assert len(history) == 3 and history[-1]["val_accuracy"] > 0.8
    run = tmp_path / "store" / "runs" / fitted.getRunId()
    assert sorted(os.listdir(run / "checkpoints")) == ["step-2.ckpt", "step-3.ckpt"]

    out = fitted.transform(df.repartition(4))  # several partitions per executor
    rows = out.select("label", "label__output").collect()
    assert len(rows) == 900
    correct = sum(max(range(10), key=r["label__output"].__getitem__) == r["label"] for r in rows)
    assert correct / len(rows) > 0.8

    fitted.write().save(str(tmp_path / "model"))
    loaded = TorchModel.load(f"file://{tmp_path / 'model'}")
    again = loaded.transform(df).select("label__output").collect()
    assert again == fitted.transform(df).select("label__output").collect()
