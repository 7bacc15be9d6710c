"""pyspark's doors onto hora: change one import and keep the rest of the code.

`from hora.spark import TorchDistributor` replaces `from pyspark.ml.torch.distributor import
TorchDistributor`, with the same arguments and meanings, on hora's engines.
"""

from hora.spark._distributor import TorchDistributor as TorchDistributor

__all__ = ["TorchDistributor"]

from hora.spark._deepspeed import DeepspeedTorchDistributor as DeepspeedTorchDistributor

__all__ += ["DeepspeedTorchDistributor"]
