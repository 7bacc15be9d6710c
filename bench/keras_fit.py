"""Keras training step rate: hora.tensorflow.keras against MultiWorkerMirroredStrategy, 2 ranks.

The same Keras 3 model (the CNN of examples/keras_digits.py) on the same data (scikit-learn's
digits, repeated), the same global batch, the same warm-up and timed steps, plain SGD:

- hora: a 2-rank `hora.run` job, `import hora.tensorflow.keras as hvd`, `hvd.init()`,
  `model.fit` with `hvd.DistributedOptimizer`, each rank on half of the global batch.
- MWMS: a 2-rank `hora.run` job whose ranks are the workers of a
  `tf.distribute.MultiWorkerMirroredStrategy` cluster (TF_CONFIG on 127.0.0.1 from hora's
  `tf_config()`, as `MirroredStrategyRunner` builds it), no hora collective at all. It first
  tries `model.fit` under the strategy; Keras 3's `model.fit` fails under a two-worker MWMS on
  TF 2.21 ("Attempt to convert a value (PerReplica ...)"), and then the side times TensorFlow's
  documented MWMS custom training loop instead: `strategy.run` of a `tf.function` train step,
  `strategy.reduce` of the loss. The output says which form was timed.

Only steps are timed (launch, tracing and warm-up are not): the time from the end of warm-up
step `--warmup` to the end of the last of `--steps` more, on rank 0. XLA is off on both sides
(hora's collectives run through `tf.numpy_function`). One job per side and round, sides
alternating and the order flipped every round; medians; ratio = hora steps/s / MWMS steps/s
(the issue's goal is >= 1.0).

    .venv/bin/python bench/keras_fit.py [--rounds 3] [--warmup 10] [--steps 60] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import hora

LEARNING_RATE = 0.01


def _digits(batch_size: int, rank: int, size: int) -> Any:
    """This rank's endless stream of `batch_size` examples of scikit-learn's digits."""
    import tensorflow as tf
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    y = digits.target.astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x[rank::size], y[rank::size]))
    return data.repeat().batch(batch_size, drop_remainder=True).prefetch(2)


def _model() -> Any:
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])  # fmt: skip


def _fit_steps_per_s(model: Any, data: Any, warmup: int, steps: int) -> float:
    """`model.fit` for warmup + steps batches; the rate of the last `steps`."""
    import keras

    marks: dict[str, float] = {}

    class StepClock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == warmup - 1:
                marks["start"] = time.perf_counter()
            elif batch == warmup + steps - 1:
                marks["end"] = time.perf_counter()

    model.fit(
        data,
        epochs=1,
        steps_per_epoch=warmup + steps,
        callbacks=[StepClock()],
        verbose=0,
        shuffle=False,
    )
    return steps / (marks["end"] - marks["start"])


def hora_side(warmup: int, steps: int, global_batch: int) -> float:
    """One 2-rank job: `model.fit` with hora's DistributedOptimizer."""
    import keras

    import hora.tensorflow.keras as hvd

    hvd.init()
    model = _model()
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LEARNING_RATE)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    data = _digits(global_batch // hvd.size(), hvd.rank(), hvd.size())
    rate = _fit_steps_per_s(model, data, warmup, steps)
    hvd.shutdown()
    return rate


def mwms_side(warmup: int, steps: int, global_batch: int) -> tuple[float, str]:
    """One 2-rank job: MultiWorkerMirroredStrategy, `model.fit` if it works, else the loop."""
    import tensorflow as tf

    from hora.spark._mirrored import tf_config

    with tf_config():
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        try:
            return _mwms_fit(strategy, warmup, steps, global_batch), "model.fit"
        except Exception as error:  # only the known Keras 3 failure falls back
            if "PerReplica" not in str(error):
                raise
        return _mwms_loop(strategy, warmup, steps, global_batch), "custom loop"


def _mwms_fit(strategy: Any, warmup: int, steps: int, global_batch: int) -> float:
    import keras

    with strategy.scope():
        model = _model()
        model.compile(
            optimizer=keras.optimizers.SGD(LEARNING_RATE),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=False,
        )
    # The strategy shards the stream: each worker reads its own half of every global batch.
    return _fit_steps_per_s(model, _digits(global_batch, 0, 1), warmup, steps)


def _mwms_loop(strategy: Any, warmup: int, steps: int, global_batch: int) -> float:
    """TensorFlow's documented MWMS custom training loop, same model, optimizer and batches."""
    import keras
    import tensorflow as tf

    with strategy.scope():
        model = _model()
        optimizer = keras.optimizers.SGD(LEARNING_RATE)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    data = strategy.experimental_distribute_dataset(_digits(global_batch, 0, 1))
    batches = iter(data)

    def replica_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            per_example = loss_fn(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def train_step(iterator):  # unannotated: AutoGraph can't resolve string annotations
        x, y = next(iterator)
        per_replica = strategy.run(replica_step, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    for _ in range(warmup):
        train_step(batches).numpy()
    start = time.perf_counter()
    for _ in range(steps):
        loss = train_step(batches)
    loss.numpy()
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch (2 ranks)")
    args = parser.parse_args()
    if args.batch_size % 2:
        parser.error(
            f"--batch-size is split over 2 ranks: give an even number, not {args.batch_size}"
        )
    work = (args.warmup, args.steps, args.batch_size)
    rates: dict[str, list[float]] = {"hora": [], "mwms": []}
    forms: set[str] = set()
    for r in range(args.rounds):
        for side in ("hora", "mwms") if r % 2 == 0 else ("mwms", "hora"):
            if side == "hora":
                rates["hora"].append(hora.run(hora_side, work, np=2)[0])
            else:
                rate, form = hora.run(mwms_side, work, np=2)[0]
                rates["mwms"].append(rate)
                forms.add(form)
    hora_rate = statistics.median(rates["hora"])
    mwms_rate = statistics.median(rates["mwms"])
    per_round = " ".join(f"{h / m:.2f}" for h, m in zip(rates["hora"], rates["mwms"], strict=True))
    print(
        f"2 ranks, global batch {args.batch_size}, {args.warmup} warm-up + {args.steps} timed "
        f"steps, {args.rounds} rounds (medians)"
    )
    print("hora: model.fit + hvd.DistributedOptimizer")
    print(f"MWMS: {' / '.join(sorted(forms))} under MultiWorkerMirroredStrategy")
    print(f"{'hora steps/s':>13} {'MWMS steps/s':>13} {'hora/MWMS':>10} {'per round':>20}")
    print(f"{hora_rate:>13.1f} {mwms_rate:>13.1f} {hora_rate / mwms_rate:>9.2f}x {per_round:>20}")


if __name__ == "__main__":
    main()
