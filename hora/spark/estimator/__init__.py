"""hora.spark's estimator door: `TorchEstimator(...).fit(df)` -> `TorchModel`, as Horovod's.

Modules, one job each: params (the pyspark.ml Params), store (the store's layout on any
pyarrow filesystem), columns (Spark columns to tensors), feed (DataFrame to Parquet once, a
shard per rank, batches from a background thread), train (what each rank runs), events
(TensorBoard), export (the final model files), tracking (MLflow), inference and model
(TorchModel.transform), persistence (save/load), estimator (TorchEstimator.fit).
"""

from hora.spark.estimator.estimator import TorchEstimator as TorchEstimator
from hora.spark.estimator.model import TorchModel as TorchModel

__all__ = ["TorchEstimator", "TorchModel"]
