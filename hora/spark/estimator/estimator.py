"""TorchEstimator: a pyspark.ml Estimator whose `fit(df)` trains a torch model on hora's ranks
and returns a TorchModel. Everything that can be checked is checked on the driver first."""

from __future__ import annotations

import copy
import datetime
import math
import secrets
import types
import warnings
from typing import Any

from pyspark.ml import Estimator
from pyspark.ml.util import MLReadable, MLWritable

from hora import engines
from hora.checkpoint import Checkpoint
from hora.config import RunConfig
from hora.engines.spark import ENGINE as SPARK
from hora.engines.spark import (
    ClassicSession,
    ConnectSession,
    Session,
    active_session,
    concurrent_slots,
)
from hora.job import launch
from hora.spark.estimator import feed, tracking
from hora.spark.estimator.columns import ColumnSpec, describe, is_pandas
from hora.spark.estimator.connect_bases import ConnectEstimator
from hora.spark.estimator.model import OUTPUT_TYPES, TorchModel
from hora.spark.estimator.params import ESTIMATOR_OBJECTS, EstimatorParams
from hora.spark.estimator.persistence import HoraReader, HoraWriter, StageFile
from hora.spark.estimator.store import CHECKPOINTS, MODEL, open_store, run_folder
from hora.spark.estimator.train import TrainJob, metric_values, step_loss, train_on_rank
from hora.storage import Location


# pyspark.ml's save(path) comes first, before pyspark.ml.connect's save(path, *, overwrite)
class TorchEstimator(  # type: ignore[misc]
    Estimator, EstimatorParams, MLWritable, MLReadable, StageFile, ConnectEstimator
):
    """Horovod's TorchEstimator on hora (keyword arguments only); a `pyspark.ml` Estimator and,
    where pyspark.ml.connect imports, a `pyspark.ml.connect` one.

    `model` (nn.Module), `optimizer` (over the model's parameters), `loss` (loss(output, label),
    or one per label column), `feature_cols`, `label_cols`, `store` (where data, checkpoints,
    event files and the final model go) are required. `validation`: a fraction of the rows
    (split by row content and the seed) or a column whose true rows are validation rows.
    `run_id`: the run's name; fitting again with the same run_id resumes it. `num_proc`: ranks
    (if None: Spark's default parallelism on a classic session, the task slots on a Spark
    Connect one). `metrics`: metric(output, label) -> number.
    `callbacks`: objects with any of on_train_begin(), on_epoch_begin(epoch),
    on_epoch_end(epoch, logs), on_train_end(history), called on every rank.
    `prediction_col`: the model adds each row's class index (the first output's argmax). `fit`
    also takes a pandas DataFrame, written to the store through the active SparkSession.
    """

    stage_objects = ESTIMATOR_OBJECTS

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        unknown = sorted(k for k in kwargs if not self.hasParam(k))
        if unknown:
            raise TypeError(
                f"TorchEstimator got unknown argument(s) {unknown}; it takes "
                f"{sorted(p.name for p in self.params)}"
            )
        self._set(**kwargs)

    def write(self) -> HoraWriter:
        return HoraWriter(self)

    @classmethod
    def read(cls) -> HoraReader:
        return HoraReader(cls)

    def _fit(self, dataset: Any) -> TorchModel:
        session = active_session()
        if is_pandas(dataset):
            dataset = _spark_frame(session, dataset)
        settings = self._checked_settings()
        store: Location = settings["store"]
        features = describe(dataset, self.getFeatureCols(), "feature")
        labels = describe(dataset, self.getLabelCols(), "label")
        validation = self.getValidation()
        if isinstance(validation, str):
            _check_validation_column(dataset, validation)
        store.check_writable()
        run_id = self.getRunId() or _new_run_id()
        run = run_folder(store, run_id)
        checkpoints = Checkpoint(run.location(CHECKPOINTS))
        found = checkpoints.latest()
        seed = self.getRandomSeed()
        if found is not None:
            _check_fits(found.state, self.getModel(), run_id, run)
            seed = found.state["seed"]
        elif seed is None:
            seed = secrets.randbelow(2**31)
        epochs = self.getEpochs()
        if found is not None and found.state["epoch"] >= epochs:
            print(
                f"hora: run {run_id!r} already trained {found.state['epoch']} epochs; not training"
            )
            return self._model_from(found.state, run_id, features, labels, settings, store)

        num_proc = self.getNumProc() or _default_ranks(session)
        specs, head = feed.sample(dataset, features, labels, self.getInputShapes())
        _try_on_a_sample(self.getModel(), specs, head, len(features), settings)
        data = feed.prepare(dataset, store, specs, len(features), validation, seed)
        if data.train_rows < num_proc:
            raise ValueError(
                f"{data.train_rows} training row(s) for {num_proc} ranks: every rank needs at "
                "least one; give more rows or lower num_proc"
            )
        job = TrainJob(
            model=self.getModel(),
            optimizer=self.getOptimizer(),
            losses=settings["losses"],
            loss_weights=settings["loss_weights"],
            metrics=settings["metrics"],
            callbacks=list(self.getCallbacks() or []),
            data=data,
            store=store,
            run_id=run_id,
            epochs=epochs,
            batch_size=self.getBatchSize(),
            shuffle=self.getShuffle(),
            seed=seed,
            verbose=self.getVerbose(),
        )
        if self.getVerbose():
            print(
                f"hora: fitting run {run_id!r} on {num_proc} ranks: {data.train_rows} training and "
                f"{data.validation_rows} validation rows (read from {data.train.uri})"
                + (f", resuming after epoch {found.state['epoch']}" if found is not None else "")
            )
        backend = SPARK.name if session is not None else engines.DEFAULT
        progress = [EpochLine(epochs)] if self.getVerbose() else []
        config = RunConfig(
            np=num_proc, backend=backend, collect_all=False, report_to=progress, progress=False
        )
        launch(train_on_rank, (job,), {}, config)
        done = checkpoints.latest()
        assert done is not None, "the ranks finished without a checkpoint"
        model = self._model_from(done.state, run_id, data.features, data.labels, settings, store)
        tracking.log_fit(
            {p.name: v for p, v in self.extractParamMap().items() if p.name not in ("model",)},
            model.getHistory(),
            run.location(MODEL) if run.is_local else "",
        )
        return model

    def _checked_settings(self) -> dict[str, Any]:
        """Every param that can be wrong on its own, checked; the store parsed."""
        self._check_model_and_optimizer()
        for name in ("feature_cols", "label_cols"):
            if not self.isDefined(getattr(self, name)) or not self.getOrDefault(name):
                raise ValueError(f"{name} is required: a list of column names")
        losses, weights = self._checked_losses()
        metrics = list(self.getMetrics() or [])
        if not all(callable(m) for m in metrics):
            raise ValueError("metrics must be callables metric(output, label) -> number")
        self._check_counts()
        self._check_validation()
        if self.getOutputType() not in OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {OUTPUT_TYPES}")
        store = self.getStore()
        if store is None:
            raise ValueError(
                "store is required: a directory (or URI) where the data, checkpoints, event "
                "files and the final model go, e.g. store='/dbfs/tmp/hora'"
            )
        return {
            "store": open_store(store),
            "losses": losses,
            "loss_weights": [float(w) for w in weights],
            "metrics": metrics,
        }

    def _check_model_and_optimizer(self) -> None:
        import torch

        model = self.getModel()
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        optimizer = self.getOptimizer()
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(
                "optimizer must be a torch.optim.Optimizer over the model's parameters, e.g. "
                f"torch.optim.SGD(model.parameters(), lr=0.1); got {type(optimizer).__name__}"
            )
        own = {id(p) for p in model.parameters()}
        if any(id(p) not in own for g in optimizer.param_groups for p in g["params"]):
            raise ValueError(
                "the optimizer holds tensors that are not the model's parameters; build it from "
                "model.parameters()"
            )

    def _checked_losses(self) -> tuple[list[Any], list[Any]]:
        """One loss and one weight per label column."""
        n_labels = len(self.getLabelCols())
        loss = self.getLoss() if self.isDefined(self.loss) else None
        losses = list(loss) if isinstance(loss, list | tuple) else [loss] * n_labels
        if loss is None or len(losses) != n_labels or not all(callable(f) for f in losses):
            raise ValueError(
                f"loss must be a callable loss(output, label) or a list of {n_labels} of them "
                f"(one per label column), got {loss!r}"
            )
        weights = self.getLossWeights() or [1.0] * n_labels
        if len(weights) != n_labels:
            raise ValueError(f"loss_weights needs {n_labels} weights, got {weights!r}")
        return losses, weights

    def _check_counts(self) -> None:
        for name in ("batch_size", "epochs"):
            value = self.getOrDefault(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        num_proc = self.getNumProc()
        if num_proc is not None and (not isinstance(num_proc, int) or num_proc < 1):
            raise ValueError(f"num_proc must be an int >= 1 or None, got {num_proc!r}")

    def _check_validation(self) -> None:
        """A fraction (stored as a float) or a column name."""
        validation = self.getValidation()
        if isinstance(validation, int | float) and not isinstance(validation, bool):
            if not 0 < validation < 1:
                raise ValueError(f"validation as a fraction must be in (0, 1), got {validation}")
            self._set(validation=float(validation))
        elif validation is not None and not isinstance(validation, str):
            raise ValueError(
                "validation must be None, a fraction in (0, 1) or the name of a boolean column, "
                f"got {validation!r}"
            )

    def _model_from(
        self,
        state: dict[str, Any],
        run_id: str,
        features: Any,
        labels: Any,
        settings: dict[str, Any],
        store: Location,
    ) -> TorchModel:
        model = copy.deepcopy(self.getModel()).to("cpu")
        model.load_state_dict(state["model"])
        shapes = self.getInputShapes()
        if shapes is None:
            shapes = [list(f.shape) if f.shape else [1] for f in features]
        return TorchModel(
            model=model,
            history=list(state["history"]),
            feature_cols=self.getFeatureCols(),
            label_cols=self.getLabelCols(),
            input_shapes=[list(s) for s in shapes],
            batch_size=self.getBatchSize(),
            run_id=run_id,
            output_cols=self.getOutputCols(),
            output_type=self.getOutputType(),
            prediction_col=self.getPredictionCol(),
            store=store.uri,
        )


def _spark_frame(session: Session | None, frame: Any) -> Any:
    """A pandas DataFrame (a pyspark.ml.connect pipeline may pass one) as a Spark DataFrame of
    the active session: the rows reach the store through Spark, as any DataFrame's do."""
    if isinstance(session, ConnectSession):
        return session.spark.createDataFrame(frame)
    if session is None:
        raise ValueError(
            "fitting on a pandas DataFrame needs an active SparkSession: the rows go to the "
            "store through Spark; start one, or pass a Spark DataFrame"
        )
    from pyspark.sql import SparkSession

    return SparkSession.builder.getOrCreate().createDataFrame(frame)


def _default_ranks(session: Session | None) -> int:
    """num_proc when it is None: Spark's default parallelism on a classic session, the task
    slots that a Spark Connect session's master and settings give, else 1."""
    if isinstance(session, ClassicSession):
        return int(session.sc.defaultParallelism)
    slots = concurrent_slots(session) if session is not None else 1
    if slots is None:
        print(
            "hora: this Spark Connect cluster's task slots cannot be counted from its master "
            "and settings; fitting on 1 rank (set num_proc for more)",
            flush=True,
        )
    return slots or 1


def _new_run_id() -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"run-{stamp}-{secrets.token_hex(3)}"


def _check_validation_column(df: Any, name: str) -> None:
    from pyspark.sql import types as T

    field = {f.name: f.dataType for f in df.schema.fields}.get(name)
    if field is None:
        raise ValueError(f"validation column {name!r} is not in the DataFrame")
    if not isinstance(field, T.BooleanType | T.NumericType):
        raise ValueError(
            f"validation column {name!r} has type {field.simpleString()}; it must be boolean "
            "(or 0/1) with true for validation rows"
        )


def _check_fits(state: Any, model: Any, run_id: str, run: Location) -> None:
    """A run_id's checkpoint must load into this model, or the fit stops before any launch."""
    try:
        copy.deepcopy(model).load_state_dict(state["model"])
    except Exception as e:
        raise ValueError(
            f"run_id {run_id!r} has a checkpoint in {run.location(CHECKPOINTS)} "
            f"that does not fit this model ({str(e).splitlines()[0][:300]}); use another run_id "
            "to start a new run, or the model that run trained"
        ) from e


def _try_on_a_sample(
    model: Any, specs: list[ColumnSpec], head: list[Any], n: int, settings: dict[str, Any]
) -> None:
    """One forward pass and loss on the first rows, on the driver: a label that cannot match
    the model's output fails here, with the shapes, before any data is written or rank started."""
    import torch

    tensors = [torch.from_numpy(a.copy()) for a in head]
    shapes = ", ".join(f"{s.name} {tuple(t.shape)}" for s, t in zip(specs, tensors, strict=True))

    sample = types.SimpleNamespace(
        model=copy.deepcopy(model).eval(),  # eval: one row must do (BatchNorm)
        losses=settings["losses"],
        loss_weights=settings["loss_weights"],
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a broadcasting loss warns; here that is a mistake
            loss, outputs = step_loss(sample, tensors[:n], tensors[n:])
            if loss.dim() != 0 or not math.isfinite(loss.item()):
                raise ValueError(f"the loss is {tuple(loss.shape)}-shaped, not one number")
            metric_values(settings["metrics"], outputs, tensors[n:])
    except Exception as e:
        raise ValueError(
            f"the model cannot be trained on these columns: on {len(tensors[0])} row(s) "
            f"({shapes}) the forward pass or loss failed: {type(e).__name__}: {e}"
        ) from e


class EpochLine:
    """The fit's progress on the driver, from rank 0's `hora.report` of every epoch:
    `hora: epoch 3/10: loss 0.4100, accuracy 0.8800, ..., 5866 rows/s`."""

    def __init__(self, epochs: int) -> None:
        self.epochs = epochs

    def __call__(self, epoch: int, logs: dict[str, Any]) -> None:
        rate = logs.get("rows_per_s", 0.0)
        shown = ", ".join(f"{k} {v:.4f}" for k, v in logs.items() if k != "rows_per_s")
        print(f"hora: epoch {epoch}/{self.epochs}: {shown}, {rate:.0f} rows/s", flush=True)
