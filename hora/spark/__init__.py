"""pyspark's doors onto hora, and hora's Spark engine: change one import, keep the rest.

`from hora.spark import TorchDistributor` replaces `from pyspark.ml.torch.distributor import
TorchDistributor`; `DeepspeedTorchDistributor` replaces pyspark's DeepSpeed door;
`MirroredStrategyRunner` replaces spark-tensorflow-distributor's (TensorFlow is imported only
inside the ranks); `TorchEstimator`/`TorchModel` replace Horovod's Spark estimator;
`make_spark_converter`/`SparkDatasetConverter`/`TransformSpec` replace Petastorm's
(`petastorm.spark`, `petastorm.TransformSpec`), on hora.data. Same arguments and meanings, on
hora's engines. The Spark engine itself is `hora.engines.spark`.
"""

from typing import Any

from hora.spark._deepspeed import DeepspeedTorchDistributor as DeepspeedTorchDistributor
from hora.spark._distributor import TorchDistributor as TorchDistributor
from hora.spark._mirrored import MirroredStrategyRunner as MirroredStrategyRunner

__all__ = [
    "DeepspeedTorchDistributor",
    "MirroredStrategyRunner",
    "SparkDatasetConverter",
    "TorchDistributor",
    "TorchEstimator",
    "TorchModel",
    "TransformSpec",
    "make_spark_converter",
]


def __getattr__(name: str) -> Any:
    """TorchEstimator and TorchModel import pyspark.ml, Petastorm's door pyarrow and hora.data:
    only when asked for."""
    if name in ("TorchEstimator", "TorchModel"):
        from hora.spark import estimator

        return getattr(estimator, name)
    if name in ("SparkDatasetConverter", "TransformSpec", "make_spark_converter"):
        from hora.spark import _petastorm

        return getattr(_petastorm, name)
    raise AttributeError(f"module 'hora.spark' has no attribute {name!r}")
