"""`hvd.SyncBatchNormalization`: Keras' BatchNormalization over the global batch of all ranks."""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from hora.collectives import Sum, size
from hora.tensorflow.mpi_ops import allreduce

__all__ = ["SyncBatchNormalization"]


@keras.saving.register_keras_serializable(package="hora")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization whose training statistics are the whole world's, as Horovod's: each
    rank's mean and mean of squares are averaged over the ranks (every rank weighs the same, so
    give each rank the same batch size) and the variance is E[x^2] - E[x]^2. Gradients flow
    through the averaging (a Sum allreduce). Inference and the moving statistics are Keras'."""

    def __init__(self, fused: bool | None = False, **kwargs: Any) -> None:
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True.")
        super().__init__(**kwargs)

    def _moments(self, inputs: Any, mask: Any) -> tuple[Any, Any]:
        mean, variance = super()._moments(inputs, mask)
        world = size()
        if world == 1:
            return mean, variance
        stacked = tf.stack([mean, variance + tf.square(mean)])
        group_mean, group_mean_of_square = tf.unstack(allreduce(stacked, op=Sum) / world)
        return group_mean, group_mean_of_square - tf.square(group_mean)
