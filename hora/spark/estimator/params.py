"""The estimator's and the model's pyspark.ml Params: what `Pipeline`, `copy` and
`extractParamMap` see, with Horovod's TorchEstimator names and a getter and setter for each."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pyspark.ml.param import Param, Params, TypeConverters


def _param(name: str, doc: str, converter: Any = None) -> Param:
    return Param(Params._dummy(), name, doc, typeConverter=converter or TypeConverters.identity)


_P = TypeVar("_P", bound=Params)


def _accessors(name: str) -> tuple[Callable[[Params], Any], Callable[[_P, Any], _P]]:
    """getX and setX of the param `name` (Horovod's camelCase methods over snake_case params),
    declared in the class body so that type checkers and readers see them."""

    def getter(self: Params) -> Any:
        return self.getOrDefault(getattr(self, name))

    def setter(self: _P, value: Any) -> _P:
        return self._set(**{name: value})

    getter.__doc__ = f"The value of `{name}`."
    setter.__doc__ = f"Set `{name}`; returns self."
    return getter, setter


_STR_LIST = TypeConverters.toListString


class SharedParams(Params):
    """What the estimator and the model it makes both have."""

    feature_cols = _param("feature_cols", "feature columns: numeric, array or ml vector", _STR_LIST)
    label_cols = _param("label_cols", "label columns", _STR_LIST)
    input_shapes = _param(
        "input_shapes",
        "per feature column, the shape of one row (e.g. [1, 8, 8]); inferred if None",
    )
    batch_size = _param("batch_size", "rows per batch on each rank", TypeConverters.toInt)
    run_id = _param("run_id", "the run's name under <store>/runs/")
    prediction_col = _param(
        "prediction_col",
        "if set, the model adds this column: each row's index of the largest value of the first "
        "output (a class index, as a double, as classification evaluators read it)",
    )

    getFeatureCols, setFeatureCols = _accessors("feature_cols")
    getLabelCols, setLabelCols = _accessors("label_cols")
    getInputShapes, setInputShapes = _accessors("input_shapes")
    getBatchSize, setBatchSize = _accessors("batch_size")
    getRunId, setRunId = _accessors("run_id")
    getPredictionCol, setPredictionCol = _accessors("prediction_col")


class EstimatorParams(SharedParams):
    model = _param("model", "the torch.nn.Module to train")
    optimizer = _param("optimizer", "a torch.optim.Optimizer over the model's parameters")
    loss = _param("loss", "loss(output, label) -> tensor, or one per label column")
    loss_weights = _param("loss_weights", "weights of the losses when there are several")
    metrics = _param("metrics", "metric(output, label) -> number, averaged per epoch")
    epochs = _param("epochs", "how many passes over the data", TypeConverters.toInt)
    validation = _param("validation", "a fraction of rows, or a column that marks them")
    store = _param("store", "root of data, checkpoints, logs and the final model")
    num_proc = _param("num_proc", "number of ranks; Spark's default parallelism if None")
    callbacks = _param("callbacks", "objects with on_train_begin/on_epoch_end/... methods")
    shuffle = _param("shuffle", "reshuffle each rank's rows every epoch", TypeConverters.toBoolean)
    random_seed = _param("random_seed", "seed of the split, the shuffles and torch; random if None")
    verbose = _param(
        "verbose", "1: one line per epoch on the driver; 0: quiet", TypeConverters.toInt
    )
    output_cols = _param("output_cols", "output columns of the model made by fit", _STR_LIST)
    output_type = _param("output_type", "'auto', 'double', 'array' or 'vector'")

    getModel, setModel = _accessors("model")
    getOptimizer, setOptimizer = _accessors("optimizer")
    getLoss, setLoss = _accessors("loss")
    getLossWeights, setLossWeights = _accessors("loss_weights")
    getMetrics, setMetrics = _accessors("metrics")
    getEpochs, setEpochs = _accessors("epochs")
    getValidation, setValidation = _accessors("validation")
    getStore, setStore = _accessors("store")
    getNumProc, setNumProc = _accessors("num_proc")
    getCallbacks, setCallbacks = _accessors("callbacks")
    getShuffle, setShuffle = _accessors("shuffle")
    getRandomSeed, setRandomSeed = _accessors("random_seed")
    getVerbose, setVerbose = _accessors("verbose")
    getOutputCols, setOutputCols = _accessors("output_cols")
    getOutputType, setOutputType = _accessors("output_type")

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(
            input_shapes=None, batch_size=32, run_id=None, loss_weights=None, metrics=None,
            epochs=1, validation=None, store=None, num_proc=None, callbacks=None, shuffle=True,
            random_seed=None, verbose=1, output_cols=None, output_type="auto", prediction_col=None,
        )  # fmt: skip


ESTIMATOR_OBJECTS = ("model", "optimizer", "loss", "loss_weights", "metrics", "callbacks")


class ModelParams(SharedParams):
    model = _param("model", "the trained torch.nn.Module")
    history = _param("history", "per-epoch train/validation loss and metrics")
    output_cols = _param("output_cols", "output columns, one per label", _STR_LIST)
    output_type = _param("output_type", "'auto', 'double', 'array' or 'vector'")
    store = _param("store", "the store the model was trained in")

    getHistory, setHistory = _accessors("history")
    getOutputCols, setOutputCols = _accessors("output_cols")
    getOutputType, setOutputType = _accessors("output_type")
    getStore, setStore = _accessors("store")

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(
            input_shapes=None, batch_size=32, run_id=None, history=None, output_cols=None,
            output_type="auto", store=None, prediction_col=None,
        )  # fmt: skip


MODEL_OBJECTS = ("model", "history")
