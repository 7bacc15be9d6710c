"""The Keras twin of `_jobs.train`: a Keras 3 MLP fitted with hora's DistributedOptimizer under
`hvd.elastic.run`, with Horovod's elastic state and callbacks (KerasState,
UpdateEpochStateCallback, UpdateBatchStateCallback, CommitStateCallback every 2 batches).

Keras 3 fixes an epoch's steps when `fit` starts, so each epoch is one `fit` over the samples the
epoch has left: a plain value of the state, `samples`, counts the epoch's samples done (every
step takes `world * batch` of them, in a fixed order per epoch; rank r takes the r-th `batch`),
advanced by a callback before each commit. Steps are logged as `_jobs.train` logs them, so the
same readers check them; `reference` fits the kept steps in one process.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np

from tests.elastic import _jobs


def _model() -> Any:
    import keras

    keras.config.set_floatx("float64")
    init = keras.initializers.GlorotUniform
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="tanh", kernel_initializer=init(seed=1)),
            keras.layers.Dense(1, kernel_initializer=init(seed=2)),
        ]
    )


def _data(plan: _jobs.Plan) -> tuple[np.ndarray, np.ndarray]:
    x, y = _jobs.dataset(plan.samples)
    return x.numpy(), y.numpy()


def _order(epoch: int, samples: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(100 + epoch).permutation(samples)]


def train(plan: _jobs.Plan) -> dict[str, Any]:
    import keras

    import hora.tensorflow.keras as hvd

    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    attempt = int(os.environ.get("HORA_RESTART_COUNT", "0"))
    x, y = _data(plan)
    model = _model()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(plan.lr, momentum=0.9))
    model.compile(optimizer=optimizer, loss="mse")
    state = hvd.elastic.KerasState(model, epoch=0, batch=0, samples=0)
    # as `_jobs.train` names its logs; Keras never re-forms in place, so its one world is 0
    log_path = Path(plan.folder, f"log-{attempt}-0-{rank}.jsonl")
    per_step = world * plan.batch

    def log(entry: dict[str, Any]) -> None:
        with log_path.open("a") as f:
            f.write(json.dumps(entry) + "\n")

    def rows(epoch: int, position: int) -> list[int]:
        start = position + rank * plan.batch
        return _order(epoch, plan.samples)[start : start + plan.batch]

    class Feed(keras.callbacks.Callback):
        """Logs each step's samples, advances `state.samples`, strikes the test's faults."""

        def __init__(self) -> None:
            super().__init__()
            self.n = 0
            self.start = state.commit_index
            self.waited = False

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            idx = rows(state.epoch, state.samples)
            log(
                {
                    "n": self.n,
                    "world": world,
                    "epoch": state.epoch,
                    "commit": state.commit_index,
                    "idx": idx,
                }
            )
            self.n += 1
            state.samples += per_step
            _jobs._maybe_fault(plan, attempt, 0, rank, world, state.commit_index - self.start)
            time.sleep(plan.step_seconds)
            ends_commit = (state.batch + 1) % 2 == 0  # CommitStateCallback's 2 batches
            if plan.wait_for_return and world < plan.full and ends_commit and not self.waited:
                self.waited = _jobs._wait_for_return(plan.folder, rank)

    feed = Feed()
    callbacks = [
        feed,
        hvd.elastic.UpdateEpochStateCallback(state),
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.CommitStateCallback(state, batches_per_commit=2),
    ]

    def batches(epoch: int, position: int):
        while True:
            idx = rows(epoch, position)
            position += per_step
            yield x[idx], y[idx]

    @hvd.elastic.run
    def loop(state: Any) -> None:
        log({"start": state.commit_index, "epoch": state.epoch, "reset_sizes": []})
        feed.start = state.commit_index
        while state.epoch < plan.epochs:
            steps = (plan.samples - state.samples) // per_step
            model.fit(
                batches(state.epoch, state.samples),
                steps_per_epoch=steps,
                initial_epoch=state.epoch,
                epochs=state.epoch + 1,
                callbacks=callbacks,
                verbose=0,
            )
            state.samples = 0
            state.commit()

    loop(state)
    return {
        "rank": rank,
        "world": world,
        "attempt": attempt,
        "weights": [w.copy() for w in model.get_weights()],
        "host": socket.gethostname(),
    }


def reference(plan: _jobs.Plan, steps: list[_jobs.Step]) -> list[np.ndarray]:
    """The kept steps in one Keras process, each on every rank's batch at once."""
    import keras

    x, y = _data(plan)
    model = _model()
    model.compile(optimizer=keras.optimizers.SGD(plan.lr, momentum=0.9), loss="mse")
    for step in steps:
        idx = [i for batch in step.batches for i in batch]
        model.train_on_batch(x[idx], y[idx])
    return [w.copy() for w in model.get_weights()]
