"""pyspark's doors onto hora: change one import and keep the rest of the code.

`from hora.spark import TorchDistributor` replaces `from pyspark.ml.torch.distributor import
TorchDistributor`, with the same arguments and meanings, on hora's engines.
"""

from hora.spark._distributor import TorchDistributor as TorchDistributor

__all__ = ["TorchDistributor"]

# spark-tensorflow-distributor's door (TensorFlow is imported only inside the ranks).
from hora.spark._mirrored import MirroredStrategyRunner as MirroredStrategyRunner

__all__ += ["MirroredStrategyRunner"]
from hora.spark._deepspeed import DeepspeedTorchDistributor as DeepspeedTorchDistributor

__all__ += ["DeepspeedTorchDistributor"]
