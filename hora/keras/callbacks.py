"""`hora.keras.callbacks`: the callbacks of `hora.tensorflow.keras.callbacks`."""

from hora.tensorflow.keras.callbacks import *  # noqa: F403 - listed in its __all__
from hora.tensorflow.keras.callbacks import __all__ as __all__
