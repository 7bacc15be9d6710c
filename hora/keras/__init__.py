"""`import hora.keras as hvd`: Horovod's Keras API for Keras 3 (TensorFlow backend), the same
module as `hora.tensorflow.keras` (Horovod had both `horovod.keras` and
`horovod.tensorflow.keras`)."""

from hora.tensorflow.keras import *  # noqa: F403 - listed in its __all__
from hora.tensorflow.keras import __all__ as __all__
from hora.tensorflow.keras import callbacks as callbacks
