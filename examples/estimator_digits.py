"""HorovodEstimator's workflow on hora: fit a Spark DataFrame, get a Transformer.

`python examples/estimator_digits.py` starts an embedded local Spark (`local[2]`, loopback only),
turns scikit-learn's real handwritten digits (1,797 8x8 images, shipped with it: nothing to
download) into a DataFrame of 64 pixel columns, and runs the usual Spark ML steps:

1. a `Pipeline` of a `VectorAssembler` (pixels -> `features` vector) and a `TorchEstimator`
   (a small CNN, 2 ranks as one Spark barrier stage, 20% of the rows for validation),
2. `fit` -> a `PipelineModel` whose last stage is a `TorchModel`; one line per epoch on the way,
3. `transform` and a Spark ML `MulticlassClassificationEvaluator` on held-out rows (>= 95%),
4. `save`, `PipelineModel.load`, and `transform` again with the loaded model: same predictions.

The store (data as Parquet, checkpoints, TensorBoard event files, the exported model) goes to
`--store` (a temporary folder by default): `tensorboard --logdir <store>/runs` shows the curves.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile


def build_spark(np: int):
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # TorchModel.transform's workers
    from pyspark.sql import SparkSession

    return (
        SparkSession.Builder()
        .master(f"local[{np}]")
        .appName("hora-estimator-digits")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", "ERROR")
        .getOrCreate()
    )


def digits_dataframe(spark):
    """The digits as 64 pixel columns (p0..p63, 0..1) and a `label`, with a fixed test split."""
    import pandas as pd
    from sklearn.datasets import load_digits

    digits = load_digits()
    frame = pd.DataFrame(digits.data / 16.0, columns=[f"p{i}" for i in range(64)])
    frame["label"] = digits.target.astype("int64")
    df = spark.createDataFrame(frame)
    train, test = df.randomSplit([0.8, 0.2], seed=0)
    return train, test, list(frame.columns[:64])


def cnn():
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
    )  # fmt: skip


def accuracy(output, label):
    return (output.argmax(1) == label).float().mean()


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--np", type=int, default=2, help="ranks (and local[N] slots)")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--store", default=None, help="store root (default: a temp folder)")
    args = parser.parse_args(argv)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")

    import torch
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F
    from torch import nn

    from hora.spark import TorchEstimator

    spark = build_spark(args.np)
    store = args.store or tempfile.mkdtemp(prefix="hora-store-")
    try:
        train, test, pixels = digits_dataframe(spark)
        torch.manual_seed(0)
        model = cnn()
        estimator = TorchEstimator(
            model=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
            loss=nn.functional.cross_entropy,
            metrics=[accuracy],
            feature_cols=["features"],
            label_cols=["label"],
            input_shapes=[[1, 8, 8]],  # the 64 pixels of a row, as the CNN wants them
            validation=0.2,
            batch_size=32,
            epochs=args.epochs,
            num_proc=args.np,
            store=store,
            random_seed=0,
        )
        assembler = VectorAssembler(inputCols=pixels, outputCol="features")
        fitted = Pipeline(stages=[assembler, estimator]).fit(train)
        torch_model = fitted.stages[-1]
        print(f"driver: trained run {torch_model.getRunId()!r}, store {store}")

        def predictions(pipeline_model):
            scores = pipeline_model.transform(test)
            best = F.expr("array_position(label__output, array_max(label__output)) - 1")
            return scores.select(
                F.col("label").cast("double").alias("label"),
                best.cast("double").alias("prediction"),
            )

        evaluator = MulticlassClassificationEvaluator(metricName="accuracy")
        scored = predictions(fitted)
        held_out = evaluator.evaluate(scored)
        print(f"driver: held-out accuracy (Spark ML evaluator) {held_out:.4f}")

        path = os.path.join(store, "saved-pipeline")
        fitted.write().overwrite().save(path)
        reloaded = predictions(PipelineModel.load(path))
        same = reloaded.collect() == scored.collect()
        print(f"driver: saved to {path}, loaded, transformed again: same predictions {same}")
        return held_out if same else 0.0
    finally:
        spark.stop()


def _spark_available() -> bool:
    import importlib.util
    import shutil

    has_java = shutil.which("java") or os.environ.get("JAVA_HOME")
    return importlib.util.find_spec("pyspark") is not None and bool(has_java)


if __name__ == "__main__":
    if not _spark_available():
        print("examples/estimator_digits.py needs pyspark and Java 17; skipped")
        sys.exit(0)
    sys.exit(0 if main() >= 0.95 else 1)
