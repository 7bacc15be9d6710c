"""TorchEstimator on a real `local[2]` Spark: few fits, each checking as much as it can.

1. A Pipeline (VectorAssembler, then the estimator, validation by fraction): fit, transform,
   save/load of the estimator, the model and the pipeline model, TensorBoard event files read
   by TensorBoard's own reader, MLflow with a local file tracking URI.
2. Array features, validation by column, callbacks, no shuffle, vector output.
3. True resume: a rank fails after epoch 2 of 4; fitting again ends bitwise equal to an
   uninterrupted run; fitting a finished run again returns it without training.
4. Bad inputs fail on the driver before any rank starts.
"""

from __future__ import annotations

import glob
import json
import os

import pytest
import torch
from torch import nn

from hora.errors import WorkerFailedError
from hora.spark import TorchEstimator, TorchModel
from tests.spark.conftest import start_spark, stop_spark
from tests.spark.estimator import _data

# a hang guard, not a speed limit: a fit is a few Spark jobs and a launch, slow on a loaded host
pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def spark():
    session = start_spark("local[2]")
    yield session
    stop_spark(session)


def test_pipeline_fit_transform_save_load_events_and_mlflow(spark, tmp_path, capfd, monkeypatch):
    import mlflow
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    df, pixels = _data.digits_as_columns(spark, limit=1000)
    estimator = _data.estimator(
        tmp_path / "store",
        epochs=3,
        validation=0.2,
        metrics=[_data.accuracy],
        run_id="pipe",
        prediction_col="prediction",
    )
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=pixels, outputCol="features"), estimator])
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3 asks for this opt-in
    # Not mlflow.set_tracking_uri: it would leave the variable set for the tests after this one.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    with mlflow.start_run() as tracked:
        fitted = pipeline.fit(df)
    out, _ = capfd.readouterr()
    assert "hora: epoch 3/3: loss" in out and "val_accuracy" in out and "rows/s" in out

    model = fitted.stages[-1]
    assert isinstance(model, TorchModel)
    history = model.getHistory()
    assert len(history) == 3
    assert set(history[0]) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert history[-1]["val_accuracy"] > 0.8
    assert history[-1]["loss"] < history[0]["loss"]

    predicted = fitted.transform(df).withColumn(
        "argmax",
        F.expr("cast(array_position(label__output, array_max(label__output)) - 1 AS double)"),
    )
    predicted = predicted.select(*pixels, "label", "label__output", "prediction", "argmax").cache()
    assert dict(predicted.dtypes)["label__output"] == "array<float>"
    assert dict(predicted.dtypes)["prediction"] == "double"
    assert predicted.filter("prediction != argmax").count() == 0
    evaluator = MulticlassClassificationEvaluator(
        labelCol="label", predictionCol="prediction", metricName="accuracy"
    )
    accuracy = evaluator.evaluate(predicted.withColumn("label", F.col("label").cast("double")))
    assert accuracy > 0.8

    # the same predictions from the module itself, on the driver
    rows = predicted.select(*pixels, "label__output").limit(5).collect()
    x = torch.tensor([[r[p] for p in pixels] for r in rows], dtype=torch.float32)
    expected = model.getModel().eval()(x)
    assert torch.allclose(torch.tensor([r["label__output"] for r in rows]), expected, atol=1e-5)

    # save/load: the model, the pipeline model, the estimator (store and run_id kept)
    model.write().save(str(tmp_path / "model"))
    with pytest.raises(FileExistsError, match="overwrite"):
        model.write().save(str(tmp_path / "model"))
    loaded = TorchModel.load(str(tmp_path / "model"))
    assert loaded.uid == model.uid and loaded.getHistory() == history
    for a, b in zip(loaded.getModel().parameters(), model.getModel().parameters(), strict=True):
        assert torch.equal(a, b)
    fitted.write().overwrite().save(str(tmp_path / "pipeline"))
    again = PipelineModel.load(str(tmp_path / "pipeline")).transform(df)
    assert again.select("label__output").collect() == predicted.select("label__output").collect()
    estimator.save(str(tmp_path / "estimator"))
    restored = TorchEstimator.load(str(tmp_path / "estimator"))
    assert restored.getStore() == str(tmp_path / "store") and restored.getRunId() == "pipe"
    assert restored.getEpochs() == 3 and restored.getValidation() == 0.2
    copied = estimator.copy({estimator.epochs: 5})
    assert copied.getEpochs() == 5 and estimator.getEpochs() == 3
    assert copied.extractParamMap()[copied.batch_size] == 32

    # the store's layout and the exported model
    run = tmp_path / "store" / "runs" / "pipe"
    assert sorted(os.listdir(run / "model")) == ["model.pkl", "model.pt2", "state_dict.pt"]
    state = torch.load(run / "model" / "state_dict.pt", weights_only=True)
    assert all(torch.equal(state[k], v) for k, v in model.getModel().state_dict().items())
    program = torch.export.load(str(run / "model" / "model.pt2"))
    assert torch.allclose(program.module()(x), expected, atol=1e-5)

    # TensorBoard's own reader finds every epoch's values
    (events,) = glob.glob(str(run / "logs" / "events.out.tfevents.*"))
    reader = EventAccumulator(events)
    reader.Reload()
    tags = reader.Tags()["scalars"]
    assert set(tags) == {"train/loss", "train/accuracy", "validation/loss", "validation/accuracy"}
    losses = reader.Scalars("validation/loss")
    assert [e.step for e in losses] == [1, 2, 3]
    assert [e.value for e in losses] == pytest.approx([h["val_loss"] for h in history])

    # MLflow: params and every epoch's metrics went to the active run
    client = mlflow.tracking.MlflowClient()
    run_data = client.get_run(tracked.info.run_id).data
    assert run_data.params["epochs"] == "3" and run_data.params["run_id"] == "pipe"
    steps = client.get_metric_history(tracked.info.run_id, "val_accuracy")
    assert [m.step for m in steps] == [1, 2, 3]


def test_array_features_validation_column_callbacks_and_vector_output(spark, tmp_path):
    df = _data.digits_as_array(spark, limit=600)
    record = tmp_path / "record"
    record.mkdir()
    estimator = _data.estimator(
        tmp_path / "store",
        validation="is_val",
        callbacks=[_data.Record(str(record))],
        shuffle=False,
        output_type="vector",
        input_shapes=[[64]],
    )
    model = estimator.fit(df)
    # every rank called the callback after every epoch with the same logs
    seen = sorted(os.listdir(record))
    assert seen == ["0-0.json", "0-1.json", "1-0.json", "1-1.json"]
    logs = [json.loads((record / name).read_text()) for name in seen]
    assert logs[0] == logs[2] and logs[1] == logs[3]
    assert logs[1] == model.getHistory()[1]
    assert "val_loss" in logs[1]
    out = model.setOutputCols(["scores"]).transform(df)
    assert dict(out.dtypes)["scores"] == "vector"
    assert out.count() == 600
    # each split written by hora.data.from_spark: a folder and the marker that finds it again
    data = tmp_path / "store" / "data"
    markers = [json.loads(path.read_text()) for path in data.glob("*.json")]
    assert sorted(m["rows"] for m in markers) == [120, 480]
    assert sorted(p.name for p in data.iterdir() if p.is_dir()) == sorted(m["dir"] for m in markers)


def test_true_resume_is_bitwise_equal_to_an_uninterrupted_run(spark, tmp_path, capfd):
    df = _data.digits_as_array(spark, limit=400)

    def estimator(run_id, callbacks=None):
        return _data.estimator(
            tmp_path / "store",
            model=_data.mlp(seed=3, dropout=0.2),  # dropout: the RNG states must be restored
            epochs=4,
            run_id=run_id,
            callbacks=callbacks,
            validation=0.25,
        )

    whole = estimator("whole").fit(df)
    with pytest.raises(WorkerFailedError, match="stopped on purpose at epoch 2"):
        estimator("broken", callbacks=[_data.FailAt(rank=1, epoch=2)]).fit(df)
    checkpoints = sorted(os.listdir(tmp_path / "store" / "runs" / "broken" / "checkpoints"))
    assert checkpoints == ["step-1.ckpt", "step-2.ckpt"]
    capfd.readouterr()
    resumed = estimator("broken").fit(df)
    out, _ = capfd.readouterr()
    assert "resuming after epoch 2" in out
    assert "epoch 3/4" in out and "epoch 1/4" not in out
    assert resumed.getHistory() == whole.getHistory()
    for (name, a), b in zip(
        resumed.getModel().state_dict().items(), whole.getModel().state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    # a finished run fitted again is returned as it is, nothing launched
    again = estimator("broken").fit(df)
    out, _ = capfd.readouterr()
    assert "already trained 4 epochs" in out and "[0@" not in out
    assert again.getHistory() == whole.getHistory()
    # three fits of the same rows wrote each split once: the later ones found it again
    assert len([p for p in (tmp_path / "store" / "data").iterdir() if p.is_dir()]) == 2


def test_bad_inputs_fail_on_the_driver_before_any_rank_starts(spark, tmp_path, capfd):
    df = _data.digits_as_array(spark, limit=64)
    store = tmp_path / "store"
    cases = [
        (dict(feature_cols=["nope"]), "feature column 'nope' is not in the DataFrame"),
        (dict(label_cols=["missing"]), "label column 'missing' is not in the DataFrame"),
        (dict(feature_cols=["name"]), "has type string; a model reads numeric"),
        (dict(label_cols=["features"]), "cannot be trained on these columns"),
        (dict(loss=nn.functional.mse_loss), "cannot be trained on these columns"),
        (dict(validation=1.5), "fraction must be in"),
        (dict(validation="name"), "must be boolean"),
        (dict(input_shapes=[[3, 3]]), "holds 9 values but column 'features' has 64"),
        (dict(store=None), "store is required"),
    ]
    named = df.withColumn("name", df.label.cast("string"))
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            _data.estimator(store, **change).fit(named)

    with pytest.raises(ValueError, match="the DataFrame is empty"):
        _data.estimator(store).fit(df.limit(0))
    # refused by hora.data.from_spark as it writes, naming the user's column
    from pyspark.sql import functions as F

    ragged = df.withColumn(
        "features", F.when(df.label == 9, F.slice("features", 1, 63)).otherwise(df.features)
    )
    with pytest.raises(ValueError, match="column 'features' holds arrays of 63 to 64 values"):
        _data.estimator(store).fit(ragged)

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(ValueError, match="cannot be written"):
        _data.estimator(blocker / "store").fit(df)

    # a run_id whose checkpoint was written for another model
    from hora.checkpoint import Checkpoint

    other = nn.Linear(64, 10)
    Checkpoint(str(store / "runs" / "other" / "checkpoints")).save(
        {"model": other.state_dict(), "epoch": 1, "history": [], "seed": 1}, 1
    )
    with pytest.raises(ValueError, match=r"run_id 'other' has a checkpoint .* does not fit"):
        _data.estimator(store, run_id="other").fit(df)

    with pytest.raises(TypeError, match="unknown argument"):
        TorchEstimator(modle=_data.mlp())
    out, err = capfd.readouterr()
    assert "[0@" not in out + err  # no rank ever started
