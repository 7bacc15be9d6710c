"""TorchModel: the Transformer that `TorchEstimator.fit` returns."""

from __future__ import annotations

import functools
import uuid
from typing import Any

import cloudpickle
from pyspark.ml import Model
from pyspark.ml.util import MLReadable, MLWritable

from hora.spark.estimator import inference, shipping
from hora.spark.estimator.columns import (
    ColumnSpec,
    describe,
    describe_pandas,
    is_pandas,
    numeric_column,
)
from hora.spark.estimator.connect_bases import ConnectModel
from hora.spark.estimator.params import MODEL_OBJECTS, ModelParams
from hora.spark.estimator.persistence import HoraReader, HoraWriter, StageFile
from hora.spark.estimator.train import as_outputs

OUTPUT_TYPES = ("auto", "double", "array", "vector")


# pyspark.ml's save(path) comes first, before pyspark.ml.connect's save(path, *, overwrite)
class TorchModel(  # type: ignore[misc]
    Model, ModelParams, MLWritable, MLReadable, StageFile, ConnectModel
):
    """A trained torch model as a pyspark.ml Model (and, where pyspark.ml.connect imports, a
    `pyspark.ml.connect` one): `transform(df)` appends one output column per label column
    (`<label>__output`, or `setOutputCols`), computed in batches in every partition, and with
    `prediction_col` each row's class index. `output_type`: "auto" gives double for one value per
    row and array<float> otherwise; "double", "array" or "vector" (pyspark.ml.linalg) force one.
    A pandas DataFrame is transformed here, on the driver, into a pandas DataFrame."""

    stage_objects = MODEL_OBJECTS

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        if kwargs:
            self._set(**kwargs)

    def getModel(self) -> Any:
        """The trained torch.nn.Module."""
        return self.getOrDefault(self.model)

    def getHistory(self) -> list[dict[str, float]]:
        """Per epoch: train `loss` and metrics, `val_loss` and `val_<metric>` with validation."""
        return list(self.getOrDefault(self.history) or [])

    def output_columns(self) -> list[str]:
        names = self.getOutputCols() or [f"{label}__output" for label in self.getLabelCols()]
        if len(names) != len(self.getLabelCols()):
            raise ValueError(
                f"{len(names)} output columns for {len(self.getLabelCols())} model outputs "
                "(one per label column); give one name per label column"
            )
        return names

    def _transform(self, dataset: Any) -> Any:
        outputs = self.output_columns()
        prediction = self.getPredictionCol()
        added = [*outputs, *([prediction] if prediction else [])]
        taken = [n for n in added if n in dataset.columns]
        if taken:
            raise ValueError(
                f"output column(s) {taken} already in the DataFrame; pick others with "
                "setOutputCols([...]) or setPredictionCol(...)"
            )
        if is_pandas(dataset):
            specs = self._feature_specs(describe_pandas(dataset, self.getFeatureCols(), "feature"))
            kinds = self._output_kinds(specs, outputs)
            return inference.predict_pandas(
                dataset, self.getModel(), specs, outputs, kinds, prediction, self.getBatchSize()
            )
        specs = self._feature_specs(describe(dataset, self.getFeatureCols(), "feature"))
        return self._transform_spark(dataset, specs, outputs, self._output_kinds(specs, outputs))

    def _transform_spark(
        self, dataset: Any, specs: list[ColumnSpec], outputs: list[str], kinds: list[str]
    ) -> Any:
        from pyspark.ml.functions import array_to_vector
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        # Vectors become arrays in temporary columns (dropped again in the UDF); numeric and
        # array columns are read as they are, so their bytes cross into Python only once.
        inputs = [
            f"__hora_input_{i}_{uuid.uuid4().hex[:8]}" if s.kind == "vector" else s.name
            for i, s in enumerate(specs)
        ]
        temps = [n for n, s in zip(inputs, specs, strict=True) if s.kind == "vector"]
        converted = [numeric_column(s, n) for n, s in zip(inputs, specs, strict=True) if n in temps]
        extended = dataset.select("*", *converted) if converted else dataset
        fields = list(dataset.schema.fields)
        for name, k in zip(outputs, kinds, strict=True):
            dtype = T.DoubleType() if k == "double" else T.ArrayType(T.FloatType(), False)
            fields.append(T.StructField(name, dtype, False))
        prediction = self.getPredictionCol()
        if prediction:
            fields.append(T.StructField(prediction, T.DoubleType(), False))
        blob = cloudpickle.dumps(self.getModel().to("cpu"))
        work = functools.partial(
            inference.predict,
            shipped=shipping.ship(dataset.sparkSession, blob),
            specs=specs,
            inputs=inputs,
            temporary=temps,
            outputs=outputs,
            kinds=kinds,
            prediction=prediction,
            batch_size=self.getBatchSize(),
        )
        result = extended.mapInArrow(work, T.StructType(fields))
        vectors = [name for name, k in zip(outputs, kinds, strict=True) if k == "vector"]
        if vectors:
            result = result.select(
                *[array_to_vector(F.col(c)).alias(c) if c in vectors else F.col(c)
                  for c in result.columns]
            )  # fmt: skip
        return result

    def _feature_specs(self, found: list[ColumnSpec]) -> list[ColumnSpec]:
        shapes = self.getInputShapes()
        if shapes is None:
            raise ValueError("this TorchModel has no input_shapes; set them with setInputShapes")
        return [s.with_shape(tuple(shape)) for s, shape in zip(found, shapes, strict=True)]

    def _output_kinds(self, specs: list[ColumnSpec], outputs: list[str]) -> list[str]:
        """ "double", "array" or "vector" per output, from output_type and the values per row."""
        kind = self.getOutputType()
        if kind not in OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {OUTPUT_TYPES}, got {kind!r}")
        widths = self._output_widths(specs)
        if self.getPredictionCol() and widths[0] < 2:
            raise ValueError(
                f"prediction_col={self.getPredictionCol()!r} picks the largest of the first "
                f"output's values per row, but output {outputs[0]!r} has {widths[0]}; unset it"
            )
        kinds = []
        for name, width in zip(outputs, widths, strict=True):
            if kind == "double" and width != 1:
                raise ValueError(
                    f"output_type='double' but output {name!r} has {width} values per row"
                )
            if kind == "auto":
                kinds.append("double" if width == 1 else "array")
            else:
                kinds.append(kind)
        return kinds

    def _output_widths(self, specs: list[ColumnSpec]) -> list[int]:
        """Values per row of each output, from one forward pass on zeros on the driver."""
        import torch

        model = self.getModel().to("cpu").eval()
        xs = [torch.zeros((2, *s.shape), dtype=torch.float32) for s in specs]
        with torch.inference_mode():
            outs = as_outputs(model(*xs), len(self.getLabelCols()))
        return [int(o.numel() // 2) for o in outs]

    def write(self) -> HoraWriter:
        return HoraWriter(self)

    @classmethod
    def read(cls) -> HoraReader:
        return HoraReader(cls)
