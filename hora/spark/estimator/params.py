"""The estimator's and the model's pyspark.ml Params: what `Pipeline`, `copy` and
`extractParamMap` see, with Horovod's TorchEstimator names and a getter and setter for each."""

from __future__ import annotations

from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters


def _param(name: str, doc: str, converter: Any = None) -> Param:
    return Param(Params._dummy(), name, doc, typeConverter=converter or TypeConverters.identity)


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def _accessors(cls: type, names: list[str]) -> type:
    """Add getX/setX for every param in `names` (snake_case names, Horovod's camelCase methods)."""
    for name in names:

        def getter(self: Params, _name: str = name) -> Any:
            return self.getOrDefault(getattr(self, _name))

        def setter(self: Params, value: Any, _name: str = name) -> Params:
            return self._set(**{_name: value})

        getter.__doc__ = f"The value of `{name}`."
        setter.__doc__ = f"Set `{name}`; returns self."
        setattr(cls, f"get{_camel(name)}", getter)
        setattr(cls, f"set{_camel(name)}", setter)
    return cls


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


_SHARED = ["feature_cols", "label_cols", "input_shapes", "batch_size", "run_id"]


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

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(
            input_shapes=None, batch_size=32, run_id=None, loss_weights=None, metrics=None,
            epochs=1, validation=None, store=None, num_proc=None, callbacks=None, shuffle=True,
            random_seed=None, verbose=1, output_cols=None, output_type="auto",
        )  # fmt: skip


_accessors(
    EstimatorParams,
    [
        *_SHARED, "model", "optimizer", "loss", "loss_weights", "metrics", "epochs",
        "validation", "store", "num_proc", "callbacks", "shuffle", "random_seed", "verbose",
        "output_cols", "output_type",
    ],
)  # fmt: skip

ESTIMATOR_OBJECTS = ("model", "optimizer", "loss", "loss_weights", "metrics", "callbacks")


class ModelParams(SharedParams):
    model = _param("model", "the trained torch.nn.Module")
    history = _param("history", "per-epoch train/validation loss and metrics")
    output_cols = _param("output_cols", "output columns, one per label", _STR_LIST)
    output_type = _param("output_type", "'auto', 'double', 'array' or 'vector'")
    store = _param("store", "the store the model was trained in")

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(
            input_shapes=None, batch_size=32, run_id=None, history=None, output_cols=None,
            output_type="auto", store=None,
        )  # fmt: skip


_accessors(ModelParams, [*_SHARED, "history", "output_cols", "output_type", "store"])

MODEL_OBJECTS = ("model", "history")
