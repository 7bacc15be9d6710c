"""A rank's share of an epoch as a `tf.data.Dataset`, through the same loader (same order)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hora.data._loader import Loader


def tf_dataset(loader: Loader, epoch: int) -> Any:
    """`tf.data.Dataset.from_generator` over the loader's numpy batches of `epoch`; the
    signature is read off the first batch (every batch has its columns and inner shapes)."""
    import tensorflow as tf

    loader.set_epoch(epoch)
    state = loader.state_dict()
    first = next(iter(loader.numpy_batches()), None)
    loader.load_state_dict(state)
    if first is None:
        raise ValueError("this rank has no batch in the epoch: use fewer ranks or drop_last=False")
    examples = {name: tf.constant(value) for name, value in first.items()}
    signature = {
        name: tf.TensorSpec(shape=(None, *value.shape[1:]), dtype=value.dtype)
        for name, value in examples.items()
    }

    def batches() -> Any:
        loader.load_state_dict(state)
        yield from loader.numpy_batches()

    return tf.data.Dataset.from_generator(batches, output_signature=signature)
