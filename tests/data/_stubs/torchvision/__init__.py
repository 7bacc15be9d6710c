"""A stand-in for torchvision, for Mosaic Streaming's import only.

`import streaming` imports `streaming.vision`, which imports torchvision at module level; PyPI's
torchvision wheels fail to load against the CPU torch this project installs (`operator
torchvision::nms does not exist`). Tests and bench/data.py put this folder first on the path
(their own process, Spark's Python workers, hora's ranks): it holds only the names streaming
imports, and nothing here is meant to run.
"""

from torchvision import datasets as datasets
from torchvision import transforms as transforms
