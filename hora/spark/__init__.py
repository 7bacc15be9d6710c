"""pyspark's doors onto hora, and hora's Spark engine: change one import, keep the rest.

`from hora.spark import TorchDistributor` replaces `from pyspark.ml.torch.distributor import
TorchDistributor`; `DeepspeedTorchDistributor` replaces pyspark's DeepSpeed door;
`MirroredStrategyRunner` replaces spark-tensorflow-distributor's (TensorFlow is imported only
inside the ranks); `TorchEstimator`/`TorchModel` replace Horovod's Spark estimator. Same arguments
and meanings, on hora's engines. The engine itself is `_engine.py` and its helpers.
"""

from typing import Any

from hora.spark._deepspeed import DeepspeedTorchDistributor as DeepspeedTorchDistributor
from hora.spark._distributor import TorchDistributor as TorchDistributor
from hora.spark._mirrored import MirroredStrategyRunner as MirroredStrategyRunner

__all__ = [
    "DeepspeedTorchDistributor",
    "MirroredStrategyRunner",
    "TorchDistributor",
    "TorchEstimator",
    "TorchModel",
]


def __getattr__(name: str) -> Any:
    """TorchEstimator and TorchModel import pyspark.ml: only when asked for."""
    if name in ("TorchEstimator", "TorchModel"):
        from hora.spark import estimator

        return getattr(estimator, name)
    raise AttributeError(f"module 'hora.spark' has no attribute {name!r}")
