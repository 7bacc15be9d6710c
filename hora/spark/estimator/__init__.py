"""hora.spark's estimator door: `TorchEstimator(...).fit(df)` -> `TorchModel`, as Horovod's.

Modules, one job each: params (the pyspark.ml Params), store (the store's layout, a
`hora.storage.Location`), columns (Spark columns cast to a model's numbers), feed (the columns
through `hora.data.from_spark`, a shard per rank from its loader), train (what each rank
runs), events (TensorBoard), export (the final model files), tracking (MLflow), inference and
model (TorchModel.transform), persistence (save/load), estimator (TorchEstimator.fit).
"""

from hora.spark.estimator.estimator import TorchEstimator as TorchEstimator
from hora.spark.estimator.model import TorchModel as TorchModel

__all__ = ["TorchEstimator", "TorchModel"]
