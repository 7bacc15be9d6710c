"""TensorFlow jobs for MirroredStrategyRunner's tests (local[2] and local-cluster)."""

from __future__ import annotations


def train(scale: float) -> dict:
    """Under the runner's strategy, a cross-worker sum and a variable made in its scope; what
    this rank saw of them. (Keras 3's model.fit fails under a two-worker
    MultiWorkerMirroredStrategy on TF 2.21 with "PerReplica ... to a Tensor", outside hora too:
    see README's limits.)"""
    import json
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    config = json.loads(os.environ["TF_CONFIG"])
    index = config["task"]["index"]
    weight = tf.Variable(1.0)  # created in the scope: a mirrored variable

    @tf.function
    def step() -> tf.Tensor:
        per_replica = strategy.run(lambda: tf.constant(scale * (index + 1)))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return {
        "strategy": isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy),
        "replicas": strategy.num_replicas_in_sync,
        "workers": len(config["cluster"]["worker"]),
        "index": index,
        "ports_distinct": len({w.rsplit(":", 1)[1] for w in config["cluster"]["worker"]}),
        "sum": float(step().numpy()),
        "mirrored": type(weight).__name__,
    }


EXPECTED = {
    "strategy": True,
    "replicas": 2,
    "workers": 2,
    "index": 0,
    "ports_distinct": 2,
    "sum": 6.0,  # 2.0 * (1 + 2)
    "mirrored": "MirroredVariable",
}
