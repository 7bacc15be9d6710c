"""pyspark's doors onto hora: change one import and keep the rest of the code.

`from hora.spark import TorchDistributor` replaces `from pyspark.ml.torch.distributor import
TorchDistributor`, with the same arguments and meanings, on hora's engines.
"""

from hora.spark._distributor import TorchDistributor as TorchDistributor

__all__ = ["TorchDistributor"]


def __getattr__(name: str):
    """TorchEstimator and TorchModel import pyspark.ml: only when asked for."""
    if name in ("TorchEstimator", "TorchModel"):
        from hora.spark import estimator

        return getattr(estimator, name)
    raise AttributeError(f"module 'hora.spark' has no attribute {name!r}")
