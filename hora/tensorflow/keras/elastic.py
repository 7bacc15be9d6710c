"""`hvd.elastic` for Keras 3 (Horovod's `horovod.tensorflow.keras.elastic`): `KerasState`, `run`
and the callbacks that keep the state's epoch and batch and commit it during `model.fit`.

    state = hvd.elastic.KerasState(model, epoch=0, batch=0)
    callbacks = [hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=10)]

    @hvd.elastic.run
    def train(state):
        state.model.fit(data, epochs=epochs, initial_epoch=state.epoch, callbacks=callbacks)

`state.epoch` counts the finished epochs and `state.batch` the finished batches of the current
one (Horovod stores the last indices, which says the same one step later). Keras 3 fixes an
epoch's steps when `fit` starts, so a run resumed mid-epoch feeds the rest of the epoch from
the committed `state.batch` (or its own position) itself.
"""

from __future__ import annotations

from typing import Any

import keras

from hora.tensorflow.elastic import HostsUpdatedInterrupt as HostsUpdatedInterrupt
from hora.tensorflow.elastic import ObjectState as ObjectState
from hora.tensorflow.elastic import State as State
from hora.tensorflow.elastic import TensorFlowKerasState
from hora.tensorflow.elastic import run as run

__all__ = [
    "CommitStateCallback",
    "HostsUpdatedInterrupt",
    "KerasState",
    "ObjectState",
    "State",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "run",
]


class KerasState(TensorFlowKerasState):
    """A Keras model, its optimizer and plain values (Horovod's `KerasState`)."""


class CommitStateCallback(keras.callbacks.Callback):
    """Commit `state` after every `batches_per_commit` batches (where a growing run stops).

    The count starts again at each commit and at each reset of the state (which goes back to
    its last commit): the ranks of a world re-formed in place, a new one included, count alike
    from there, though a commit that interrupted the run never returned."""

    def __init__(self, state: State, batches_per_commit: int = 1) -> None:
        super().__init__()
        if batches_per_commit < 1:
            raise ValueError(f"batches_per_commit must be >= 1, got {batches_per_commit}")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit
        state.register_reset_callbacks([self._from_commit])

    def _from_commit(self) -> None:
        self.batches_remaining = self.batches_per_commit

    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self._from_commit()
            self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """`state.batch`: how many batches of the current epoch are done (0 when one begins)."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self._offset = 0

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._offset = getattr(self.state, "batch", 0)  # a resumed epoch: what was done before

    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        self.state.batch = self._offset + batch + 1  # type: ignore[attr-defined]

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.batch = 0  # type: ignore[attr-defined]
        self._offset = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """`state.epoch`: how many epochs are done, whether `fit` counts from `initial_epoch` or
    from 0 (`epochs=total - state.epoch`, Horovod's example)."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self._offset: int | None = None

    def on_train_begin(self, logs: Any = None) -> None:
        self._offset = None

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        if self._offset is None:
            self._offset = getattr(self.state, "epoch", 0) - epoch

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.epoch = epoch + (self._offset or 0) + 1  # type: ignore[attr-defined]
