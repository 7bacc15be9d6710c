"""A Horovod user's test module for the Keras API, with only the import changed.

Written the way Horovod's own test/parallel/test_tensorflow2_keras.py is (a `tf.test.TestCase`
training small models with `model.fit` under `hvd.DistributedOptimizer` and Horovod's
callbacks), for Keras 3: learning-rate schedules, sparse gradients, optimizer configs, gradient
aggregation, local layers (`PartialDistributedOptimizer`), SyncBatchNormalization in a model,
saving and loading, and the timeline. Run in every rank after the TensorFlow suite, in the same
pytest session (see `session.py`).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import hora.tensorflow.keras as hvd  # was: import horovod.tensorflow.keras as hvd
from tests.tensorflow.horovod_session._timeline import recorded_tracks, shared_trace


def weights(model: Any) -> np.ndarray:
    return np.concatenate([np.asarray(v).ravel() for v in model.weights])


def same_on_every_rank(values: np.ndarray) -> bool:
    every = hvd.allgather_object(values)
    return all(np.allclose(every[0], v, atol=1e-6) for v in every)


class KerasTests(tf.test.TestCase):
    def dense_model(self, seed: int) -> keras.Model:
        keras.utils.set_random_seed(seed)
        return keras.Sequential(
            [keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)]
        )

    def data(self) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(hvd.rank())  # every rank its own shard
        return rng.normal(size=(16, 3)).astype("float32"), rng.normal(size=(16, 2)).astype(
            "float32"
        )

    def test_train_model_lr_schedule(self):
        """fit with the warm-up and schedule callbacks: every rank ends with rank 0's model."""
        hvd.init()
        lr = 0.01 * hvd.size()
        model = self.dense_model(seed=hvd.rank())
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9))
        model.compile(loss="mse", optimizer=opt)
        callbacks = [
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            hvd.callbacks.MetricAverageCallback(),
            hvd.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=1),
            hvd.callbacks.LearningRateScheduleCallback(initial_lr=lr, start_epoch=1,
                                                       multiplier=0.5),  # 0.5 ** (epoch - 1)
        ]  # fmt: skip
        x, y = self.data()
        history = model.fit(x, y, batch_size=8, epochs=3, callbacks=callbacks, verbose=0)
        self.assertTrue(same_on_every_rank(weights(model)))
        self.assertTrue(same_on_every_rank(np.array(history.history["loss"])))  # averaged
        self.assertAllClose(float(model.optimizer.learning_rate), lr * 0.5)

    def _embedding_model(self) -> keras.Model:
        keras.utils.set_random_seed(3)
        return keras.Sequential([keras.Input((2,), dtype="int32"), keras.layers.Embedding(10, 3),
                                 keras.layers.Flatten(), keras.layers.Dense(1)])  # fmt: skip

    def test_sparse_as_dense(self):
        hvd.init()
        for sparse_as_dense in (True, False):
            model = self._embedding_model()
            opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01),
                                           sparse_as_dense=sparse_as_dense)  # fmt: skip
            model.compile(loss="mse", optimizer=opt)
            x = np.random.default_rng(hvd.rank()).integers(0, 10, size=(16, 2))
            model.fit(x, np.ones((16, 1), "float32"), batch_size=8, epochs=1, verbose=0)
            self.assertTrue(same_on_every_rank(weights(model)))

    def test_from_config(self):
        hvd.init()
        opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.002))
        cfg = opt.get_config()
        opt_copy = opt.__class__.from_config(cfg)
        self.assertEqual(cfg, opt_copy.get_config())
        model = self.dense_model(seed=hvd.rank())
        model.compile(loss="mse", optimizer=opt_copy)
        x, y = self.data()
        model.fit(x, y, batch_size=8, epochs=1, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])  # fmt: skip
        self.assertTrue(same_on_every_rank(weights(model)))  # the copy reduces too

    def test_gradient_aggregation(self):
        """backward_passes_per_step: local accumulation, one reduction per that many steps."""
        hvd.init()
        model = self.dense_model(seed=0)
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01), backward_passes_per_step=2,
                                       average_aggregated_gradients=True)  # fmt: skip
        model.compile(loss="mse", optimizer=opt)
        x, y = self.data()
        model.fit(x, y, batch_size=4, epochs=1, verbose=0)
        self.assertTrue(same_on_every_rank(weights(model)))
        self.assertEqual(int(opt.iterations), 2)

    def test_partial_distributed_optimizer(self):
        """A local layer's weights stay each rank's own (also an Embedding, whose gradients
        are IndexedSlices); the others are averaged."""
        hvd.init()
        keras.utils.set_random_seed(5)
        local = keras.layers.Embedding(8, 2)
        shared = keras.layers.Dense(1)
        model = keras.Sequential([keras.Input((1,), dtype="int32"), local,
                                  keras.layers.Flatten(), shared])  # fmt: skip
        opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=local)
        model.compile(loss="mse", optimizer=opt)
        x = np.full((8, 1), hvd.rank() % 8)
        model.fit(x, np.full((8, 1), float(hvd.rank())), batch_size=4, epochs=1, verbose=0)
        self.assertTrue(same_on_every_rank(weights_of(shared)))
        if hvd.size() > 1:
            self.assertFalse(same_on_every_rank(weights_of(local)))
        with self.assertRaises(ValueError):
            hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=[object()])

    def test_sync_batch_normalization_fit(self):
        """SyncBatchNormalization in a model: the moving statistics are the world's."""
        hvd.init()
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3),
                                  hvd.SyncBatchNormalization(), keras.layers.Dense(1)])  # fmt: skip
        model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)))
        x = np.random.default_rng(hvd.rank()).normal(hvd.rank(), 1, size=(16, 3)).astype("f4")
        model.fit(x, np.ones((16, 1), "f4"), batch_size=8, epochs=1, verbose=0)
        bn = model.layers[1]
        self.assertTrue(same_on_every_rank(np.asarray(bn.moving_mean)))
        self.assertTrue(same_on_every_rank(weights(model)))

    def test_load_model(self):
        hvd.init()
        model = self.dense_model(seed=0)
        model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)))
        x, y = self.data()
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.keras")
            model.save(path)
            loaded = hvd.load_model(path)
        self.assertEqual(int(loaded.optimizer.iterations), 2)
        loaded.fit(x, y, batch_size=8, epochs=1, verbose=0)
        self.assertTrue(same_on_every_rank(weights(loaded)))

    def test_keras_collectives(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        self.assertAllClose(hvd.allreduce(tf.constant([float(rank)]), average=False),
                            [size * (size - 1) / 2])  # fmt: skip
        self.assertAllEqual(hvd.allgather(tf.constant([rank])), list(range(size)))
        self.assertAllEqual(hvd.broadcast(tf.constant([rank]), size - 1), [size - 1])
        got = hvd.reducescatter(tf.ones([size * 2, 1]), op=hvd.Sum)
        self.assertAllClose(got, np.full([2, 1], float(size)))

    def test_timeline(self):
        """start_timeline/stop_timeline, as Keras users call them (HOROVOD_TIMELINE=DYNAMIC is
        set for the job)."""
        hvd.init()
        name = "allreduce.keras.timeline.probe"
        with shared_trace() as path:
            hvd.start_timeline(path)
            hvd.allreduce(tf.ones([4]), name="keras.timeline.probe")
            hvd.stop_timeline()
            wanted = {(r, name) for r in range(hvd.size())}
            self.assertLessEqual(wanted, recorded_tracks(path, wanted))


def weights_of(layer: Any) -> np.ndarray:
    return np.concatenate([np.asarray(v).ravel() for v in layer.weights])
