"""TorchModel: the Transformer that `TorchEstimator.fit` returns."""

from __future__ import annotations

import functools
import uuid
from typing import Any

from pyspark.ml import Model
from pyspark.ml.util import MLReadable, MLWritable

from hora.spark.estimator import inference
from hora.spark.estimator.columns import ColumnSpec, describe, numeric_column
from hora.spark.estimator.params import MODEL_OBJECTS, ModelParams
from hora.spark.estimator.persistence import HoraReader, HoraWriter
from hora.spark.estimator.train import as_outputs

OUTPUT_TYPES = ("auto", "double", "array", "vector")


class TorchModel(Model, ModelParams, MLWritable, MLReadable):
    """A trained torch model as a pyspark.ml Model: `transform(df)` appends one output column
    per label column (`<label>__output`, or `setOutputCols`), computed in batches in every
    partition. `output_type`: "auto" gives double for one value per row and array<float>
    otherwise; "double", "array" or "vector" (pyspark.ml.linalg) force one."""

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
        from pyspark.ml.functions import array_to_vector
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        outputs = self.output_columns()
        taken = [n for n in outputs if n in dataset.columns]
        if taken:
            raise ValueError(
                f"output column(s) {taken} already in the DataFrame; pick others with "
                "setOutputCols([...])"
            )
        kind = self.getOutputType()
        if kind not in OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {OUTPUT_TYPES}, got {kind!r}")
        specs = self._feature_specs(describe(dataset, self.getFeatureCols(), "feature"))
        widths = self._output_widths(specs)
        kinds = []
        for name, width in zip(outputs, widths, strict=True):
            if kind == "double" and width != 1:
                raise ValueError(
                    f"output_type='double' but output {name!r} has {width} values per row"
                )
            kinds.append(
                "double" if kind == "double" or (kind == "auto" and width == 1) else "array"
            )

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
        spark = dataset.sparkSession
        import cloudpickle

        model = self.getModel().to("cpu")
        broadcast = spark.sparkContext.broadcast(cloudpickle.dumps(model))
        work = functools.partial(
            inference.predict,
            broadcast=broadcast,
            token=uuid.uuid4().hex,
            specs=specs,
            inputs=inputs,
            temporary=temps,
            outputs=outputs,
            kinds=kinds,
            batch_size=self.getBatchSize(),
        )
        result = extended.mapInArrow(work, T.StructType(fields))
        if kind == "vector":
            result = result.select(
                *[array_to_vector(F.col(c)).alias(c) if c in outputs else F.col(c)
                  for c in result.columns]
            )  # fmt: skip
        return result

    def _feature_specs(self, found: list[ColumnSpec]) -> list[ColumnSpec]:
        shapes = self.getInputShapes()
        if shapes is None:
            raise ValueError("this TorchModel has no input_shapes; set them with setInputShapes")
        return [s.with_shape(tuple(shape)) for s, shape in zip(found, shapes, strict=True)]

    def _output_widths(self, specs: list[ColumnSpec]) -> list[int]:
        """Values per row of each output, from one forward pass on zeros on the driver."""
        import torch

        model = self.getModel().to("cpu").eval()
        xs = [torch.zeros((2, *s.shape), dtype=torch.float32) for s in specs]
        with torch.inference_mode():
            outs = as_outputs(model(*xs), len(self.getLabelCols()))
        return [int(o.numel() // 2) for o in outs]

    def write(self) -> HoraWriter:
        return HoraWriter(self, MODEL_OBJECTS)

    @classmethod
    def read(cls) -> HoraReader:
        return HoraReader(cls)
