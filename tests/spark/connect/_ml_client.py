"""The estimator on a Spark Connect session, in a client process of its own (as `_client`):

    python -m tests.spark.connect._ml_client URL CHECK [CHECK ...]

Each check reports one `RESULT {json}` line through `_client.main`; test_estimator.py judges
them. The data is scikit-learn's digits (no download), 4 of 5 rows to train, the 5th to test.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import cloudpickle
import numpy as np
import torch
from torch import nn

from hora.spark import TorchEstimator, TorchModel
from hora.spark.estimator import shipping
from tests.spark.connect._client import check, main
from tests.spark.estimator import _data

PIXELS = [f"p{i}" for i in range(64)]


def _digits() -> tuple[Any, Any]:
    """Train and test DataFrames: 64 double pixel columns and a long label."""
    from pyspark.sql import SparkSession

    spark = SparkSession.active()
    x, y = _data.digits_rows()
    rows = [(i % 5 == 0, *r, label) for i, (r, label) in enumerate(zip(x, y, strict=True))]
    schema = "test boolean, " + ", ".join(f"{p} double" for p in PIXELS) + ", label long"
    df = spark.createDataFrame(rows, schema).cache()
    return df.filter("NOT test").drop("test"), df.filter("test").drop("test")


def _accuracy(scored: Any) -> float:
    """pyspark.ml.connect's evaluator (torch metrics from torcheval, on Spark or pandas)."""
    from pyspark.ml.connect.evaluation import MulticlassClassificationEvaluator

    return MulticlassClassificationEvaluator(metricName="accuracy").evaluate(scored)


def _estimator(store: str) -> TorchEstimator:
    model = _data.mlp()
    return TorchEstimator(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        loss=nn.functional.cross_entropy,
        feature_cols=["features"],
        label_cols=["label"],
        prediction_col="prediction",
        store=store,
        epochs=10,
        batch_size=32,
        random_seed=7,
        run_id="digits",
    )


@check
def ml_connect_pipeline_on_spark() -> dict[str, Any]:
    """Fitted on a Spark DataFrame and scored; the saves and loads are the pandas check's."""
    return _ml_connect_pipeline(on_pandas=False, saves=False)


@check
def ml_connect_pipeline_on_pandas() -> dict[str, Any]:
    return _ml_connect_pipeline(on_pandas=True, saves=True)


def _ml_connect_pipeline(on_pandas: bool, saves: bool) -> dict[str, Any]:
    """pyspark.ml.connect's Pipeline (ArrayAssembler, StandardScaler, the estimator) fitted on
    a Spark or a pandas DataFrame and scored by its evaluator; with `saves`, saved and loaded as
    its pipelines are, and as pyspark.ml stages are, and a pandas DataFrame through the loaded
    pipeline (Spark jobs on torch's Python workers: about half the check's time)."""
    from pyspark.ml.connect import Pipeline
    from pyspark.ml.connect.feature import ArrayAssembler, StandardScaler

    train, test = _digits()
    result: dict[str, Any] = {"seconds": {}}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hora-ml-connect-") as folder:
        estimator = _estimator(os.path.join(folder, "store"))
        stages = [
            ArrayAssembler(inputCols=PIXELS, outputCol="raw", featureSizes=[1] * 64),
            StandardScaler(inputCol="raw", outputCol="features"),
            estimator,
        ]
        fitted = Pipeline(stages=stages).fit(train.toPandas() if on_pandas else train)
        result["seconds"]["fit"] = round(time.monotonic() - started, 1)
        scored = fitted.transform(test).cache()
        result["columns"] = scored.columns
        result["accuracy"] = _accuracy(scored)
        result["uploaded_for_a_small_model"] = sorted(name for _, name in shipping._UPLOADED)
        if saves:
            result.update(_as_ml_connect_saves(fitted, test, folder))
            result.update(_as_pyspark_ml_saves(estimator, fitted.stages[-1], train, test, folder))
    result["seconds"]["total"] = round(time.monotonic() - started, 1)
    return result


def _as_ml_connect_saves(fitted: Any, test: Any, folder: str) -> dict[str, Any]:
    """saveToLocal/loadFromLocal; the loaded pipeline on Spark and on pandas; save(path)."""
    from pyspark.ml.connect import PipelineModel

    path = os.path.join(folder, "pipeline")
    fitted.saveToLocal(path)
    loaded = PipelineModel.loadFromLocal(path)
    frame = loaded.transform(test.toPandas())
    result = {
        "saved_files": sorted(os.listdir(path)),
        "loaded_stages": [type(s).__name__ for s in loaded.stages],
        "loaded_accuracy": _accuracy(loaded.transform(test)),
        "pandas": {
            "type": type(frame).__name__,
            "rows": len(frame),
            "accuracy": _accuracy(frame),
        },
    }
    try:
        fitted.save(os.path.join(folder, "through-the-server"))
        result["save_through_the_server"] = "saved"
    except Exception as exc:
        result["save_through_the_server"] = f"{type(exc).__name__}: {exc}"
    return result


def _as_pyspark_ml_saves(
    estimator: Any, model: Any, train: Any, test: Any, folder: str
) -> dict[str, Any]:
    """The stages' own save/load (metadata through the session), and the fitted model in a
    pyspark.ml PipelineModel after pyspark.ml's VectorAssembler and StandardScaler (server-side
    ML on Connect; vector features), scored by pyspark.ml's evaluator, saved and loaded."""
    from pyspark.ml import PipelineModel
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.feature import StandardScaler, VectorAssembler

    assemble = VectorAssembler(inputCols=PIXELS, outputCol="raw")
    scaler = StandardScaler(inputCol="raw", outputCol="features", withMean=True, withStd=True)
    ml_pipeline = PipelineModel(stages=[assemble, scaler.fit(assemble.transform(train)), model])
    ml_pipeline.write().save(os.path.join(folder, "ml-pipeline"))
    loaded = PipelineModel.load(os.path.join(folder, "ml-pipeline"))
    scored = ml_pipeline.transform(test).cache()
    predicted = [r.prediction for r in scored.select("prediction").collect()]
    inputs = scored.drop("label__output", "prediction")

    def predictions(m: Any) -> list[float]:
        return [r.prediction for r in m.transform(inputs).select("prediction").collect()]

    model.write().save(os.path.join(folder, "model"))
    reloaded = TorchModel.load(os.path.join(folder, "model"))
    estimator.write().save(os.path.join(folder, "estimator"))
    restored = TorchEstimator.load(os.path.join(folder, "estimator"))
    evaluator = MulticlassClassificationEvaluator(metricName="accuracy")
    return {
        "model_reloaded": {
            "uid": reloaded.uid == model.uid,
            "same_predictions": predictions(reloaded) == predicted,
        },
        "in_a_pyspark_ml_pipeline": {
            "stages": [type(s).__name__ for s in loaded.stages],
            "features": type(scored.head()["features"]).__name__,
            "accuracy": evaluator.evaluate(scored),
            "loaded_accuracy": evaluator.evaluate(loaded.transform(test)),
        },
        "estimator_reloaded": {
            "store": restored.getStore() == estimator.getStore(),
            "epochs": restored.getEpochs(),
            "prediction_col": restored.getPredictionCol(),
            "model": type(restored.getModel()).__name__,
        },
    }


@check
def large_model_as_artifact() -> dict[str, Any]:
    """A model too large for the query plan reaches the tasks as a session artifact file."""
    from pyspark.sql import SparkSession

    torch.manual_seed(0)
    big = nn.Sequential(nn.Linear(64, 40_000), nn.ReLU(), nn.Linear(40_000, 10))
    model = TorchModel(
        model=big, feature_cols=["features"], label_cols=["label"], input_shapes=[[64]]
    )
    x, y = _data.digits_rows(limit=50)
    df = SparkSession.active().createDataFrame(
        list(zip(x, y, strict=True)), "features array<double>, label long"
    )
    rows = model.transform(df).collect()
    got = np.array([r["label__output"] for r in rows], dtype=np.float32)
    with torch.inference_mode():
        expected = big(torch.tensor(x, dtype=torch.float32)).numpy()
    return {
        "pickled_bytes": len(cloudpickle.dumps(big)),
        "uploaded": sorted(name for _, name in shipping._UPLOADED),
        "max_difference": float(np.abs(got - expected).max()),
    }


if __name__ == "__main__":
    main()
