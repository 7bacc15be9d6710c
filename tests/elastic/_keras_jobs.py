"""The Keras twin of `_jobs.train`: a Keras 3 MLP fitted with hora's DistributedOptimizer under
`hvd.elastic.run`, with Horovod's elastic state and callbacks (KerasState,
UpdateEpochStateCallback, UpdateBatchStateCallback, CommitStateCallback every 2 batches).

Keras 3 fixes an epoch's steps when `fit` starts, so each epoch is one `fit` over the samples the
epoch has left: a plain value of the state, `samples`, counts the epoch's samples done (every
step takes `world * batch` of them, in a fixed order per epoch; rank r takes the r-th `batch`;
an epoch's last step may share out fewer, as a world re-formed in place can leave them),
advanced by a callback before each commit. The rank and the size are read in each world (a lost
rank's survivors re-form in place, renumbered; a new rank joins a world grown in place), and
steps are logged as `_jobs.train` logs them (by attempt and world within it), so the same
readers check them; `reference` fits the kept steps in one process.
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


def _each(plan: _jobs.Plan, world: int, position: int) -> int:
    """Each rank's batch at `position`: a full one, or an even share of the epoch's last samples
    (a world re-formed in place may leave fewer than a full step of them)."""
    left = plan.samples - position
    assert left % world == 0, (left, world)
    return min(plan.batch, left // world)


def train(plan: _jobs.Plan) -> dict[str, Any]:
    import keras

    import hora.tensorflow.keras as hvd

    hvd.init()
    attempt = int(os.environ.get("HORA_RESTART_COUNT", "0"))
    x, y = _data(plan)
    model = _model()
    # Horovod's predivided average: the size is a constant of `fit`'s traced function, which
    # must be traced again in a world re-formed in place
    optimizer = hvd.DistributedOptimizer(
        keras.optimizers.SGD(plan.lr, momentum=0.9), gradient_predivide_factor=2.0
    )
    model.compile(optimizer=optimizer, loss="mse")
    state = hvd.elastic.KerasState(model, epoch=0, batch=0, samples=0)
    sizes: list[int] = []
    state.register_reset_callbacks([sizes.append])
    # this world's place, read in `loop` (a world re-formed in place renumbers the ranks)
    me = {"rank": 0, "world": 0, "generation": 0}

    def log(entry: dict[str, Any]) -> None:
        path = Path(plan.folder, f"log-{attempt}-{me['generation']}-{me['rank']}.jsonl")
        with path.open("a") as f:
            f.write(json.dumps(entry) + "\n")

    def rows(epoch: int, position: int) -> list[int]:
        take = _each(plan, me["world"], position)
        start = position + me["rank"] * take
        return _order(epoch, plan.samples)[start : start + take]

    class Feed(keras.callbacks.Callback):
        """Logs each step's samples, advances `state.samples`, strikes the test's faults."""

        def __init__(self) -> None:
            super().__init__()
            self.n = 0
            self.start = state.commit_index
            self.waited = False

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            rank, world = me["rank"], me["world"]
            idx = rows(state.epoch, state.samples)
            log(
                {
                    "n": self.n,
                    "world": world,
                    "epoch": state.epoch,
                    "commit": state.commit_index,
                    "idx": idx,
                    "t": time.time(),
                }
            )
            self.n += 1
            state.samples += world * _each(plan, world, state.samples)
            commits = state.commit_index - self.start
            _jobs._maybe_fault(plan, attempt, me["generation"], rank, world, commits)
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
            position += me["world"] * _each(plan, me["world"], position)
            yield x[idx], y[idx]

    @hvd.elastic.run
    def loop(state: Any) -> None:
        me.update(rank=hvd.rank(), world=hvd.size(), generation=_jobs._generation())
        start = state.commit_index
        log({"start": start, "epoch": state.epoch, "reset_sizes": list(sizes), "pid": os.getpid()})
        feed.start, feed.n, feed.waited = start, 0, False
        per_step = me["world"] * plan.batch
        while state.epoch < plan.epochs:
            steps = -(-(plan.samples - state.samples) // per_step)  # the last one maybe short
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
        "rank": hvd.rank(),
        "world": hvd.size(),
        "attempt": attempt,
        "weights": [w.copy() for w in model.get_weights()],
        "optimizer": [v.numpy().copy() for v in optimizer.variables],  # momentum, iterations
        "pid": os.getpid(),
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


def variables(steps_grown: int) -> dict[str, Any]:
    """Plain tf.Variables in Horovod's `TensorFlowState`, in a custom loop that runs until its
    world has grown (in place) and then `steps_grown` steps more: each step adds the world size
    to every element of a variable (an allreduce of ones) and to a plain value, `added`. A rank
    starts its variable at `1 + 1000 * rank`: a new rank's own start must give way to rank 0's."""
    import tensorflow as tf

    import hora.tensorflow as hvd

    hvd.init()
    total = tf.Variable(tf.fill([3], 1.0 + 1000.0 * hvd.rank()))
    state = hvd.elastic.TensorFlowState([total], step=0, added=0.0, grown=0)
    starts: list[dict[str, Any]] = []

    @hvd.elastic.run
    def loop(state: Any) -> None:
        starts.append({"step": state.step, "world": hvd.size(), "value": total.numpy().tolist()})
        while state.grown < steps_grown and state.step < 2000:
            total.assign_add(hvd.allreduce(tf.ones([3]), op=hvd.Sum))
            state.added += hvd.size()
            state.grown += int(hvd.size() > 1)
            state.step += 1
            state.commit()
            time.sleep(0.05)

    loop(state)
    return {
        "rank": hvd.rank(),
        "world": hvd.size(),
        "pid": os.getpid(),
        "value": total.numpy().tolist(),
        "step": state.step,
        "added": state.added,
        "starts": starts,
    }
