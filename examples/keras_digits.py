"""The Keras demo: the seed's "Keras MNIST with HorovodRunner" workflow on scikit-learn's digits.

`python examples/keras_digits.py` (or `make demo`) runs `train_hvd` on 2 ranks through
`HorovodRunner(np=-2)` with Horovod's Keras API (`import hora.tensorflow.keras as hvd`), Keras 3
on TensorFlow, following the migration steps: `hvd.init()`, pin the GPU by local rank, shard the
data by rank, scale the learning rate by the number of ranks, wrap the optimizer in
`hvd.DistributedOptimizer`, broadcast the initial state from rank 0
(`BroadcastGlobalVariablesCallback(0)`), average the metrics, warm the learning rate up, and save
checkpoints on rank 0 only. Rank 0 reports the held-out accuracy; the driver gets it back.
"""

from __future__ import annotations

import argparse
import os
import sys

from hora import HorovodRunner


def train_hvd(
    epochs: int = 20, learning_rate: float = 0.05, batch_size: int = 32, checkpoint_dir: str = ""
) -> float:
    """One rank's training; returns the held-out accuracy (the same on every rank)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    import hora.tensorflow.keras as hvd

    hvd.init()  # 1. initialise Horovod
    gpus = tf.config.list_physical_devices("GPU")  # 2. one GPU per process, by local rank
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")

    digits = load_digits()  # 1,797 real 8x8 digits shipped with scikit-learn: nothing to download
    x = (digits.images / 16.0).astype("float32")[..., None]  # (N, 8, 8, 1)
    y = digits.target
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0)
    x_train, y_train = x_train[hvd.rank() :: hvd.size()], y_train[hvd.rank() :: hvd.size()]  # 3.

    keras.utils.set_random_seed(hvd.rank())  # different on purpose: the broadcast makes them equal
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])  # fmt: skip
    # 4. scale the learning rate by the number of ranks; 5. average gradients across ranks
    optimizer = keras.optimizers.SGD(learning_rate * hvd.size(), momentum=0.9)
    model.compile(
        optimizer=hvd.DistributedOptimizer(optimizer),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # 6. start from rank 0's state
        hvd.callbacks.MetricAverageCallback(),  # logged metrics: the average over the ranks
        hvd.callbacks.LearningRateWarmupCallback(  # ramp up to the scaled rate
            initial_lr=learning_rate * hvd.size(), warmup_epochs=3
        ),
    ]
    if checkpoint_dir and hvd.rank() == 0:  # 7. checkpoints by rank 0 only
        path = os.path.join(checkpoint_dir, "checkpoint-{epoch}.weights.h5")
        callbacks.append(keras.callbacks.ModelCheckpoint(path, save_weights_only=True))
    model.fit(
        x_train, y_train, batch_size=batch_size, epochs=epochs, callbacks=callbacks,
        verbose=2 if hvd.rank() == 0 else 0,
    )  # fmt: skip
    logits = model.predict(x_test, verbose=0)
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
    if hvd.rank() == 0:
        print(f"held-out accuracy: {accuracy:.4f}", flush=True)
    hvd.shutdown()
    return accuracy


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--np", type=int, default=2, help="number of local processes")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--checkpoint-dir", default="", help="rank 0 saves checkpoints here")
    args = parser.parse_args(argv)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    accuracy = HorovodRunner(np=-args.np).run(
        train_hvd, epochs=args.epochs, checkpoint_dir=args.checkpoint_dir
    )
    print(f"driver: rank 0 returned held-out accuracy {accuracy:.4f}")
    return accuracy


if __name__ == "__main__":
    sys.exit(0 if main() >= 0.95 else 1)
