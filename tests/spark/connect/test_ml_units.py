"""TorchEstimator and TorchModel as `pyspark.ml.connect` stages where no Spark is needed:
pyspark.ml.connect transforms, evaluates and saves pandas DataFrames on the client alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from hora.engines.spark.session import active_session
from hora.spark import TorchEstimator, TorchModel
from tests.spark.estimator import _data

pd = pytest.importorskip("pandas")
cml = pytest.importorskip("pyspark.ml.connect", reason="Spark Connect's client libraries")


def _model(**kwargs) -> TorchModel:
    settings = {
        "model": _data.mlp(),
        "feature_cols": ["features"],
        "label_cols": ["label"],
        "input_shapes": [[64]],
        "output_cols": None,  # as fit sets it: a None that pyspark.ml.connect must not save
        "history": [{"loss": 1.0}],
        "run_id": "units",
    }
    settings.update(kwargs)
    return TorchModel(**settings)


def _digits(rows: int = 40):
    x, y = _data.digits_rows(limit=rows)
    frame = pd.DataFrame(np.array(x), columns=[f"p{i}" for i in range(64)])
    frame["label"] = y
    return frame


def test_the_stages_are_pyspark_ml_and_pyspark_ml_connect_ones():
    import pyspark.ml as ml

    assert isinstance(TorchEstimator(), ml.Estimator) and isinstance(
        TorchEstimator(), cml.Estimator
    )
    assert isinstance(_model(), ml.Model) and isinstance(_model(), cml.Model)
    # pyspark.ml's methods come first: they take what pyspark.ml.connect's do, and more
    assert TorchEstimator.fit is ml.Estimator.fit
    assert TorchModel.transform is ml.Transformer.transform


def test_a_pipeline_model_transforms_and_scores_a_pandas_dataframe_on_the_client():
    from pyspark.ml.connect.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.connect.feature import ArrayAssembler

    frame = _digits()
    pixels = [c for c in frame.columns if c != "label"]
    model = _model(prediction_col="prediction")
    assemble = ArrayAssembler(inputCols=pixels, outputCol="features", featureSizes=[1] * 64)
    out = cml.PipelineModel(stages=[assemble, model]).transform(frame)

    assert isinstance(out, pd.DataFrame) and "prediction" not in frame.columns
    with torch.inference_mode():
        expected = model.getModel()(torch.tensor(np.stack(out["features"]), dtype=torch.float32))
    assert np.allclose(np.stack(out["label__output"]), expected.numpy(), atol=1e-6)
    assert list(out["prediction"]) == expected.argmax(1).double().tolist()
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(out)
    assert accuracy == pytest.approx((out["prediction"] == out["label"]).mean())


def test_pandas_outputs_follow_output_type_and_taken_names_are_refused():
    frame = _digits(5).assign(features=lambda f: list(f.iloc[:, :64].to_numpy()))
    out = _model(output_type="vector").transform(frame)
    assert type(out["label__output"][0]).__name__ == "DenseVector"
    single = nn.Linear(64, 1)
    out = _model(model=single).transform(frame)
    assert out["label__output"].dtype == np.float64
    with pytest.raises(ValueError, match="prediction_col='prediction' picks the largest"):
        _model(model=single, prediction_col="prediction").transform(frame)
    with pytest.raises(ValueError, match=r"output column\(s\) \['label'\] already"):
        _model(output_cols=["label"]).transform(frame)


def test_save_to_local_and_load_from_local_keep_params_and_python_objects(tmp_path):
    model = _model(prediction_col="prediction")
    model.saveToLocal(str(tmp_path / "model"))
    loaded = TorchModel.loadFromLocal(str(tmp_path / "model"))
    assert sorted(p.name for p in tmp_path.joinpath("model").iterdir()) == [
        "TorchModel.objects.pkl",
        "metadata.json",
    ]
    assert loaded.uid == model.uid and loaded.getRunId() == "units"
    assert loaded.getPredictionCol() == "prediction" and loaded.getHistory() == [{"loss": 1.0}]
    for a, b in zip(loaded.getModel().parameters(), model.getModel().parameters(), strict=True):
        assert torch.equal(a, b)

    estimator = _data.estimator(tmp_path / "store", validation=0.2)
    estimator.saveToLocal(str(tmp_path / "estimator"))
    restored = TorchEstimator.loadFromLocal(str(tmp_path / "estimator"))
    assert restored.getStore() == str(tmp_path / "store") and restored.getValidation() == 0.2
    assert isinstance(restored.getOptimizer(), torch.optim.SGD)
    assert restored.getLoss() is nn.functional.cross_entropy


def test_fitting_a_pandas_dataframe_without_a_spark_session_says_what_it_needs(tmp_path):
    if active_session() is not None:
        pytest.skip("a Spark session is active in this process")
    estimator = _data.estimator(tmp_path)
    with pytest.raises(ValueError, match="needs an active SparkSession"):
        estimator.fit(_digits(5))
