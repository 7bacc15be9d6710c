"""TorchEstimator and TorchModel on real Spark Connect, on both kinds of Connect session (the
`url` fixture: `remote("local[2]")`, and a separate server over local-cluster[2,1,1024]).

The doors' client process of each kind (`doors_client`, run as `_ml_client`, after the doors'
checks) fits a `pyspark.ml.connect` Pipeline (ArrayAssembler, StandardScaler, TorchEstimator) on
scikit-learn's digits and scores it with `pyspark.ml.connect`'s evaluator, and transforms with a
model too large for the query plan. The pipeline is fitted on a Spark DataFrame on
`remote("local[2]")` and on a pandas DataFrame on the separate server (each fit costs a launch;
both inputs are covered). On the separate server only (about half a client's time: Spark jobs on
torch's Python workers; the same client code on either kind; their tests on `remote("local[2]")`
are skipped, saying so), the fitted pipeline is saved and loaded both ways, a pandas DataFrame
goes through the loaded one, and the fitted model goes in a `pyspark.ml` PipelineModel after
VectorAssembler and StandardScaler.
"""

from __future__ import annotations

import pytest

from tests.spark.connect.conftest import kind_of, require_spark_connect

require_spark_connect()
pytest.importorskip("torcheval", reason="pyspark.ml.connect's evaluators need torcheval")
pytest.importorskip("sklearn", reason="the digits data comes from scikit-learn")
pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def client(doors_client):
    """test_doors.py's client process, which ran these checks after the doors' (`ml_checks`)."""
    return doors_client


@pytest.fixture(scope="module")
def pipeline(client):
    (name,) = [n for n in client.results if n.startswith("ml_connect_pipeline")]
    return client.value(name)


@pytest.fixture(scope="module")
def saved(pipeline, url):
    """The pipeline's saves and loads: the separate server's client only."""
    if kind_of(url) == "remote-local":
        pytest.skip("the saves and loads run on the separate server only (see the docstring)")
    return pipeline


def test_a_pyspark_ml_connect_pipeline_with_the_estimator_reaches_95_percent(client, pipeline):
    assert pipeline["accuracy"] >= 0.95
    assert pipeline["columns"][-4:] == ["raw", "features", "label__output", "prediction"]
    # num_proc=None: the session's task slots (2 on both masters)
    assert "hora: fitting run 'digits' on 2 ranks: 1437 training" in client.output
    assert "hora: epoch 10/10: loss" in client.output


def test_the_fitted_pipeline_saves_and_loads_as_pyspark_ml_connect_pipelines_do(saved):
    assert saved["saved_files"] == [
        "metadata.json",
        "pipeline_stage_1.StandardScalerModel.arrow.parquet",
        "pipeline_stage_2.TorchModel.objects.pkl",
    ]
    assert saved["loaded_stages"] == ["ArrayAssembler", "StandardScalerModel", "TorchModel"]
    assert saved["loaded_accuracy"] == saved["accuracy"]


def test_the_loaded_pipeline_transforms_a_pandas_dataframe_into_one(saved):
    frame = saved["pandas"]
    assert frame["type"] == "DataFrame" and frame["rows"] == 360
    assert frame["accuracy"] == pytest.approx(saved["accuracy"])


def test_saving_through_a_default_server_to_a_local_path_is_refused_by_the_server(saved):
    """pyspark.ml.connect's save(path) uploads each file with copyFromLocalToFs, which a server
    refuses for a local destination unless spark.connect.copyFromLocalToFs.allowDestLocal is set:
    why the docs send users to saveToLocal or to a cluster path."""
    refused = saved["save_through_the_server"]
    assert "local file system destination path is not supported" in refused


def test_the_model_scores_in_a_pyspark_ml_pipeline_after_vector_assembler_and_scaler(saved):
    """pyspark.ml.connect has no VectorAssembler: pyspark.ml's runs server-side on Connect, and
    the fitted model follows it and pyspark.ml's StandardScaler (vector features) in a pyspark.ml
    PipelineModel, saved and loaded as those are."""
    ml = saved["in_a_pyspark_ml_pipeline"]
    assert ml["stages"] == ["VectorAssembler", "StandardScalerModel", "TorchModel"]
    assert ml["features"] == "DenseVector"
    assert ml["accuracy"] >= 0.95 and ml["loaded_accuracy"] == ml["accuracy"]


def test_the_estimator_and_the_model_save_and_load_as_pyspark_ml_stages(saved):
    assert saved["model_reloaded"] == {"uid": True, "same_predictions": True}
    assert saved["estimator_reloaded"] == {
        "store": True,
        "epochs": 10,
        "prediction_col": "prediction",
        "model": "Sequential",
    }


def test_a_small_model_rides_in_the_plan_and_a_large_one_as_a_session_artifact(pipeline, client):
    assert pipeline["uploaded_for_a_small_model"] == []
    large = client.value("large_model_as_artifact")
    assert large["pickled_bytes"] > 8 << 20
    assert len(large["uploaded"]) == 1 and large["uploaded"][0].startswith("hora-model-")
    assert large["max_difference"] < 1e-4
