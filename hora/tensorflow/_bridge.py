"""TensorFlow data into hora's collective loop and back, eagerly and inside `tf.function`.

The loop moves torch tensors; a TF tensor enters as its numpy array seen through
`torch.from_numpy` (no copy: the loop never writes to the input of an out-of-place op) and
the result leaves as a TF tensor over the same memory (DLPack). Eagerly that is a direct call;
inside a `tf.function` it becomes a `tf.numpy_function` with the shapes known at trace time.

Inside one traced function, collectives run in the order they were traced (each waits on the
one before, by a control dependency). A blocking numpy_function holds one of TF's inter-op
threads; without the chain, two ranks that happened to start different collectives first could
fill their pools with operations the other rank never starts. Trace order is the same on every
rank, and consistent with the data flow, so the chain never waits on something that waits on it.
"""

from __future__ import annotations

import itertools
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import torch

from hora.tensorflow import _errors

# numpy (TF's view of the bytes) -> torch: the dtypes torch.from_numpy does not take travel as
# their bits, re-labelled on the torch side.
_BITS_AS: dict[str, tuple[Any, torch.dtype]] = {"bfloat16": (np.uint16, torch.bfloat16)}
_TORCH_BACK: dict[torch.dtype, tuple[torch.dtype, Any]] = {}


def to_torch(array: Any) -> torch.Tensor:
    """A torch tensor over the same memory as `array` (copied only if not C-contiguous)."""
    a = np.asarray(array)
    if not a.flags.c_contiguous:
        a = np.array(a, order="C")
    special = _BITS_AS.get(a.dtype.name)
    if special is not None:
        bits, dtype = special
        _TORCH_BACK[dtype] = (torch.int16, a.dtype)
        return _from_numpy(a.view(bits)).view(dtype)
    return _from_numpy(a)


def _from_numpy(a: np.ndarray) -> torch.Tensor:
    if a.flags.writeable:
        return torch.from_numpy(a)
    with warnings.catch_warnings():  # read-only TF buffers: out-of-place ops only read them
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(a)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """The numpy array TF will copy the result from."""
    back = _TORCH_BACK.get(tensor.dtype)
    if back is not None:
        carrier, np_dtype = back
        return tensor.view(carrier).numpy().view(np_dtype)
    return tensor.numpy()


_TF_ALIGNMENT = 64  # EIGEN_MAX_ALIGN_BYTES: Tensor::CheckTypeAndIsAligned


def to_tf(tensor: torch.Tensor) -> tf.Tensor:
    """An eager TF tensor over the result's memory (DLPack: TF keeps the torch storage alive);
    a copy where DLPack cannot carry it: bool, a layout TF refuses, or memory not aligned as
    TF's kernels assume (TF's from_dlpack does not check; a kernel aborts the process later)."""
    if tensor.dtype != torch.bool and tensor.data_ptr() % _TF_ALIGNMENT == 0:
        try:
            return tf.experimental.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(tensor))
        except Exception:  # e.g. alignment or strides TF does not take
            pass
    return tf.convert_to_tensor(to_numpy(tensor))


_graph_counters: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_graph_last_op: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def graph_name(kind: str) -> str:
    """A name for an unnamed collective traced into a graph: the name scope and its place in the
    graph, so a retrace (a new graph) gives the same names on every rank."""
    graph = tf.compat.v1.get_default_graph()
    counter = _graph_counters.get(graph)
    if counter is None:
        counter = _graph_counters[graph] = itertools.count()
    scope = tf.get_current_name_scope()
    return f"tf.{scope + '/' if scope else ''}{kind}.{next(counter)}"


def run(
    call: Callable[[list[torch.Tensor]], list[torch.Tensor]],
    tensors: Sequence[Any],
    out_dtypes: Sequence[tf.DType],
    out_shapes: Sequence[Any],
    op_name: str,
) -> list[tf.Tensor]:
    """Run `call` (torch tensors in, torch tensors out) on TF tensors: directly when eager, as a
    chained `tf.numpy_function` inside a graph; its failures raise Horovod's TF error classes
    (`_errors`)."""
    if tf.executing_eagerly():
        try:
            # np.asarray shares the eager tensor's buffer (`.numpy()` would copy it).
            outputs = call([to_torch(np.asarray(t)) for t in tensors])
        except Exception as exc:
            translated = _errors.to_tf(exc)
            if translated is exc:
                raise
            raise translated from exc
        return [to_tf(o) for o in outputs]

    def py(*arrays: Any) -> list[Any]:
        try:
            outputs = [to_numpy(o) for o in call([to_torch(a) for a in arrays])]
        except Exception as exc:
            message = _errors.refusal(exc)
            if message is None:
                raise  # the numpy_function kernel maps it (ValueError: InvalidArgument, ...)
            return [
                *(np.zeros(0, d.as_numpy_dtype) for d in out_dtypes),
                _errors.refused_path(message),
            ]
        return [*outputs, _errors.OK_STATUS]

    graph = tf.compat.v1.get_default_graph()
    previous = _graph_last_op.get(graph)
    with tf.control_dependencies([previous] if previous is not None else []):
        *outputs, status = tf.numpy_function(
            py, list(tensors), [*out_dtypes, tf.string], stateful=True, name=op_name
        )
    with tf.control_dependencies([_errors.check(status, op_name)]):
        outputs = tf.raw_ops.IdentityN(input=outputs)  # none read before the check
    for out, shape in zip(outputs, out_shapes, strict=True):
        out.set_shape(shape)
    _graph_last_op[graph] = outputs[0].op
    return outputs
