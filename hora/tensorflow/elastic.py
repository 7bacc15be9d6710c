"""`hvd.elastic` for TensorFlow and Keras 3 (Horovod's `horovod.tensorflow.elastic`).

`TensorFlowKerasState(model, optimizer, **kwargs)` keeps a Keras model's weights and its
optimizer's variables (as NumPy arrays) and plain values; `TensorFlowState(variables, session,
**kwargs)` a list of tf.Variables (eagerly, or in a TF1 graph through its Session). `run` is the
same retry loop as hora.torch's (`hora.collectives.elastic.run`): in-place recovery from a failed
collective, a world re-formed in place from the survivors of a lost rank and grown in place with
new ranks (on the engines that can), and under a hora run commits kept on each host, the restore
of the freshest one by a new attempt, and a clean end at a commit when the run grows by a
restart. Keras' callbacks for it are in `hora.tensorflow.keras.elastic`.

A `tf.function` holds the world it was traced in: the size and this rank's place are read at
trace time (the gradients' scaling, a one-rank shortcut, SyncBatchNormalization's divisor).
After a reset the state drops Keras' compiled functions, so `fit` traces them in the new
world; a `tf.function` of the user's own must be traced anew by a reset callback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import tensorflow as tf

from hora.collectives import HorovodInternalError, elastic
from hora.collectives.elastic import HostsUpdatedInterrupt as HostsUpdatedInterrupt
from hora.collectives.elastic import ObjectState as ObjectState
from hora.collectives.elastic import State as State
from hora.collectives.objects import allgather_object
from hora.tensorflow import _errors
from hora.tensorflow.functions import broadcast_variables

R = TypeVar("R")

__all__ = [
    "HostsUpdatedInterrupt",
    "ObjectState",
    "State",
    "TensorFlowKerasState",
    "TensorFlowState",
    "run",
]


def run(func: Callable[..., R]) -> Callable[..., R]:
    """Decorate `func(state, *args, **kwargs)` to be retried from `state`'s last commit,
    resumed by a new attempt of another size, re-formed in place when a rank is lost and grown
    in place when new ranks join (see `hora.collectives.elastic.run`). A collective that failed
    inside a `tf.function` surfaces as TF's UnknownError: it is raised again as the
    HorovodInternalError the loop heals."""

    @functools.wraps(func)
    def translated(state: State, *args: Any, **kwargs: Any) -> R:
        try:
            return func(state, *args, **kwargs)
        except Exception as exc:
            if isinstance(exc, HorovodInternalError) or not _errors.collective_loop_failed(exc):
                raise
            raise _errors.HorovodInternalOpError(None, None, str(exc)) from exc

    return elastic.run(translated, in_place=True, grow_in_place=True)


class TensorFlowKerasState(ObjectState):
    """A Keras model, its optimizer (default: the model's compiled one) and plain values.

    `commit()` copies the weights and the optimizer's variables to NumPy (and, under hora, to
    the host's commit store); `sync()` broadcasts rank 0's. Keras builds an optimizer's
    variables (momentum, ...) at its first step, so an optimizer that has not stepped yet (a
    rank that joins a running world, a restore into a fresh one) is built first: every rank
    then holds the same variables, and the new rank rank 0's values of them.
    `backend` is Horovod's and unused.
    """

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None, **kwargs: Any):
        del backend
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self._save_model()
        super().__init__(**kwargs)

    def _optimizer_variables(self) -> list[Any]:
        return list(self.optimizer.variables) if self.optimizer is not None else []

    def _build_optimizer(self) -> None:
        """Create the optimizer's variables for the model's, as its first step would (zeros)."""
        built = getattr(self.optimizer, "built", True)
        if self.optimizer is not None and not built and self.model.trainable_variables:
            self.optimizer.build(self.model.trainable_variables)

    def _save_model(self) -> None:
        self._saved_model = [w.copy() for w in self.model.get_weights()]
        self._saved_optimizer = [v.numpy().copy() for v in self._optimizer_variables()]

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        self.model.set_weights(self._saved_model)
        if self._saved_optimizer:
            if len(self._optimizer_variables()) != len(self._saved_optimizer):
                self._build_optimizer()
            for variable, value in zip(
                self._optimizer_variables(), self._saved_optimizer, strict=True
            ):
                variable.assign(value)
        super().restore()

    def reset(self) -> None:
        """Keras traced `fit`'s, `evaluate`'s and `predict`'s functions in the world before:
        drop them, so that the next call traces them in this one."""
        for name in ("train_function", "test_function", "predict_function"):
            if getattr(self.model, name, None) is not None:
                setattr(self.model, name, None)
        super().reset()

    def sync(self) -> None:
        """Rank 0's weights, optimizer variables and values on every rank, then saved (a new
        rank's restore goes back to them, not to its own initial weights)."""
        self._build_optimizer()
        _same_on_every_rank(
            {"model": len(self.model.variables), "optimizer": len(self._optimizer_variables())}
        )
        broadcast_variables(self.model.variables, root_rank=0)
        if self._optimizer_variables():
            broadcast_variables(self._optimizer_variables(), root_rank=0)
        self._save_model()
        super().sync()

    def committed(self) -> Any:
        return super().committed() | {
            "model": self._saved_model,
            "optimizer": self._saved_optimizer,
        }

    def load_committed(self, state: Any) -> None:
        self._saved_model = list(state["model"])
        self._saved_optimizer = list(state["optimizer"])
        super().load_committed(state)


def _same_on_every_rank(counts: dict[str, int]) -> None:
    """Refuse a sync whose ranks hold different numbers of variables (a broadcast of them would
    pair the wrong ones, or wait for ever): e.g. a model built on some ranks only, by a first
    call, where a rank that joins a running world has not called it yet."""
    every = allgather_object(counts, name="elastic.variable_counts")
    if any(c != every[0] for c in every):
        raise ValueError(
            f"the ranks' Keras states differ (variables per rank: {every}): build the model "
            "(keras.Input, or model.build) before hvd.elastic.run, on every rank alike"
        )


class TensorFlowState(ObjectState):
    """tf.Variables (default: the graph's global variables) and plain values, as Horovod's.

    `commit()` copies the variables to NumPy, `restore()` assigns them back and `sync()`
    broadcasts rank 0's. Eagerly the variables are read and assigned directly; in a TF1 graph
    through `session` (default: the default session), which runs the broadcast op built here.
    """

    def __init__(self, variables: Any = None, session: Any = None, **kwargs: Any):
        self.variables = list(variables or tf.compat.v1.global_variables())
        self.session = session or tf.compat.v1.get_default_session()
        self._eager = tf.executing_eagerly()
        self._bcast_op = None if self._eager else broadcast_variables(self.variables, 0)
        self._save_variables()
        super().__init__(**kwargs)

    def _save_variables(self) -> None:
        if self._eager:
            self._values = [v.numpy().copy() for v in self.variables]
        else:
            self._values = list(self.session.run(self.variables))

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self.variables, self._values, strict=True):
            if self._eager:
                variable.assign(value)
            else:
                variable.load(value, self.session)
        super().restore()

    def sync(self) -> None:
        if self._eager:
            broadcast_variables(self.variables, root_rank=0)
        else:
            self.session.run(self._bcast_op)
        self._save_variables()
        super().sync()

    def committed(self) -> Any:
        return super().committed() | {"variables": self._values}

    def load_committed(self, state: Any) -> None:
        self._values = list(state["variables"])
        super().load_committed(state)
