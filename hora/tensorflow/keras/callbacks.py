"""Horovod's Keras callbacks for Keras 3 (`hvd.callbacks.*`), with Horovod's formulas.

Keras 3 changed what Horovod's callbacks relied on: `optimizer.variables` is a list,
`optimizer.lr` and `keras.backend.get_value/set_value` are gone (the learning rate is
`optimizer.learning_rate`, a variable), and variables are `keras.Variable`s without `.ref()`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from hora.collectives import size
from hora.tensorflow import mpi_ops
from hora.tensorflow.functions import broadcast_variables

__all__ = [
    "BestModelCheckpoint",
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
]


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Start every rank from `root_rank`'s weights and optimizer state.

    The model's variables are broadcast when training begins (so the first step already starts
    from the same weights), and, as in Horovod, the model's and the optimizer's after the first
    batch (Keras 3 creates the optimizer's variables in the first step). `local_variables` stay
    as each rank has them. `device` is accepted and ignored.
    """

    def __init__(self, root_rank: int, device: str = "", local_variables: Any = None) -> None:
        super().__init__()
        del device
        self.root_rank = int(root_rank)
        self.local_ids = {id(v) for v in (local_variables or [])}
        self.broadcast_done = False

    def _shared(self, variables: Any) -> list[Any]:
        return [v for v in variables if id(v) not in self.local_ids]

    def on_train_begin(self, logs: Any = None) -> None:
        if self.model.built:
            broadcast_variables(self._shared(self.model.variables), self.root_rank)

    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.broadcast_done:
            return
        broadcast_variables(self._shared(self.model.variables), self.root_rank)
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None:
            broadcast_variables(self._shared(optimizer.variables), self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Average every metric in `logs` over the ranks at the end of each epoch (put it before
    callbacks that read metrics: ReduceLROnPlateau, TensorBoard, checkpoints). `device` is
    accepted and ignored."""

    def __init__(self, device: str = "") -> None:
        super().__init__()
        del device

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if not logs:
            return
        names = sorted(logs)
        values = tf.constant([float(logs[n]) for n in names], dtype=tf.float64)
        averaged = mpi_ops.allreduce(values, name=f"MetricAverageCallback.{epoch}").numpy()
        for name, value in zip(names, averaged, strict=True):
            logs[name] = float(value)


def _get_lr(optimizer: Any) -> float:
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def _set_lr(optimizer: Any, value: float) -> None:
    lr = optimizer._learning_rate if hasattr(optimizer, "_learning_rate") else None
    if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule) or callable(lr):
        raise ValueError(
            "a learning-rate callback cannot set the rate of an optimizer built with a "
            "LearningRateSchedule; give the optimizer a float learning_rate"
        )
    optimizer.learning_rate = value


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Horovod's schedule: `lr = initial_lr * multiplier(epoch)` from `start_epoch` until
    `end_epoch`; a constant `multiplier` m means `m ** (epoch - start_epoch)` (staircase).
    With `staircase=False` the epoch is fractional and the rate changes every batch.

    Momentum correction (Goyal et al.) needs the momentum to be a variable; Keras 3 optimizers
    keep it as a float baked into the traced step, so it is applied only when it is a
    `keras.Variable` (an honest limit, see README).
    """

    def __init__(
        self,
        initial_lr: float,
        multiplier: float | Callable[[float], float],
        start_epoch: int = 0,
        end_epoch: int | None = None,
        staircase: bool = True,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
        verbose: int = 0,
    ) -> None:
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = float(initial_lr)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0
        self.restore_momentum: Any = None
        if not callable(multiplier):
            constant = float(multiplier)
            self.staircase = True
            self.multiplier: Callable[[float], float] = lambda epoch: (
                constant ** (epoch - start_epoch)
            )
        else:
            self.multiplier = multiplier

    def _autodetect_steps_per_epoch(self) -> int:
        steps = (self.params or {}).get("steps")
        if steps:
            return int(steps)
        raise ValueError(
            "Could not autodetect the number of steps per epoch; pass steps_per_epoch= to the "
            "callback (or steps_per_epoch= to model.fit)"
        )

    def _adjust_learning_rate(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        old_lr = _get_lr(optimizer)
        new_lr = self.initial_lr * self.multiplier(epoch)
        _set_lr(optimizer, new_lr)
        momentum = getattr(optimizer, "momentum", None)
        if self.momentum_correction and isinstance(momentum, keras.Variable) and old_lr:
            self.restore_momentum = float(keras.ops.convert_to_numpy(momentum))
            momentum.assign(self.restore_momentum * new_lr / old_lr)

    def _restore_momentum_if_needed(self) -> None:
        if self.restore_momentum is not None:
            self.model.optimizer.momentum.assign(self.restore_momentum)
            self.restore_momentum = None

    def on_train_begin(self, logs: Any = None) -> None:
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self.current_epoch < self.start_epoch or (
            self.end_epoch is not None and self.current_epoch >= self.end_epoch
        ):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            assert self.steps_per_epoch
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._restore_momentum_if_needed()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if logs is not None:
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Horovod's gradual warmup (Goyal et al.): from `initial_lr / size` to `initial_lr` over
    `warmup_epochs`, every batch: `lr'(e) = lr / size * (e * (size - 1) / warmup + 1)`, with
    `e` the fractional epoch shifted by one batch so that each epoch ends on a round value."""

    def __init__(
        self,
        initial_lr: float,
        warmup_epochs: int = 5,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
        verbose: int = 0,
    ) -> None:
        def multiplier(epoch: float) -> float:
            assert self.steps_per_epoch
            epoch += 1.0 / self.steps_per_epoch
            n = size()
            return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)

        super().__init__(
            initial_lr,
            multiplier,
            start_epoch=0,
            end_epoch=warmup_epochs,
            staircase=False,
            momentum_correction=momentum_correction,
            steps_per_epoch=steps_per_epoch,
            verbose=verbose,
        )

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        super().on_epoch_end(epoch, logs)
        if self.end_epoch is not None and epoch == self.end_epoch - 1 and self.verbose > 0:
            lr = _get_lr(self.model.optimizer)
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {lr:g}.")


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Keep the best model seen so far (`save_best_only=True`), as Horovod's Keras estimator
    does. Keras 3 needs the file name up front: `filepath` (hora's addition) defaults to
    `best_model.keras`, or `best_model.weights.h5` with `save_weights_only`. Add it on rank 0."""

    def __init__(
        self,
        monitor: str = "val_loss",
        verbose: int = 0,
        save_weights_only: bool = False,
        mode: str = "auto",
        save_freq: Any = "epoch",
        filepath: str | None = None,
    ) -> None:
        if filepath is None:
            filepath = "best_model.weights.h5" if save_weights_only else "best_model.keras"
        super().__init__(
            filepath=filepath,
            monitor=monitor,
            verbose=verbose,
            save_best_only=True,
            save_weights_only=save_weights_only,
            mode=mode,
            save_freq=save_freq,
        )
