"""The error classes Horovod's TensorFlow ops raise, for the failures of hora's collective loop.

Horovod's TF ops are C++ kernels: what they check fails as a `tf.errors` class (the ranks
disagree on a shape, dtype, op or root, or Horovod is not initialized: FailedPreconditionError;
a bad argument such as alltoall splits or a set this rank is not in: InvalidArgumentError; a
lost peer or a shutdown: UnknownError), while what Horovod checks in Python stays a Python error.
hora's collective loop runs the same checks; what it raises while running an op is translated
here.

Eagerly that is a plain translation. Inside a `tf.function` the op is a `tf.numpy_function`,
whose kernel maps the Python error itself (ValueError and TypeError -> InvalidArgument,
NotImplementedError -> Unimplemented, anything else -> Unknown) and has no way to say
FailedPrecondition. So a refusal is not raised there but returned as a path that a native
`ReadFile` op then reads: "/dev/null" (empty) when the op succeeded, "/dev/null/<message>"
when it was refused, which TF's file system reports as FAILED_PRECONDITION ("Not a directory")
with the message in it. It is the one stock kernel that fails that way with a message of ours.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from hora.collectives import NOT_INITIALIZED, HorovodInternalError
from hora.collectives.framework import CollectiveRefusedError

__all__ = [
    "OK_PATH",
    "OK_STATUS",
    "HorovodInternalOpError",
    "check",
    "collective_loop_failed",
    "refusal",
    "refused_path",
    "to_tf",
]

OK_PATH = b"/dev/null"
OK_STATUS = np.array(OK_PATH, dtype=object)  # what the numpy_function returns as it is
_MAX_MESSAGE = 3000  # well below PATH_MAX (4096): a longer path would be another error


class HorovodInternalOpError(tf.errors.UnknownError, HorovodInternalError):
    """A lost peer or a shut-down collective loop, eagerly: Horovod's tf.errors.UnknownError, and
    still the HorovodInternalError that hora's and Horovod's elastic code catch."""


def collective_loop_failed(exc: BaseException) -> bool:
    """Whether `exc` is the loop's HorovodInternalError: raised eagerly as itself, or out of a
    `tf.function` as the UnknownError whose message names it (Horovod's elastic `run` tells
    its own ops' failures by their messages too)."""
    if isinstance(exc, HorovodInternalError):
        return True
    return isinstance(exc, tf.errors.UnknownError) and (
        f"{HorovodInternalError.__name__}:" in (exc.message or "")
    )


def refusal(exc: BaseException) -> str | None:
    """The message of a failure Horovod reports as FailedPrecondition, else None."""
    if isinstance(exc, CollectiveRefusedError):
        return str(exc)
    if isinstance(exc, ValueError) and exc.args == (NOT_INITIALIZED,):
        return NOT_INITIALIZED
    return None


def to_tf(exc: Exception) -> Exception:
    """The error an eager Horovod op would raise for `exc` (`exc` itself when none applies)."""
    message = refusal(exc)
    if message is not None:
        return tf.errors.FailedPreconditionError(None, None, message)
    if isinstance(exc, HorovodInternalError):
        return HorovodInternalOpError(None, None, str(exc))
    if isinstance(exc, ValueError | TypeError):
        return tf.errors.InvalidArgumentError(None, None, str(exc))
    if isinstance(exc, NotImplementedError):
        return tf.errors.UnimplementedError(None, None, str(exc))
    return exc


def refused_path(message: str) -> bytes:
    """The path whose read fails with `message` (see the module's docstring)."""
    text = message.replace("\0", " ")[:_MAX_MESSAGE]
    return OK_PATH + b"/\n" + text.encode("utf-8", "replace") + b"\n"


def check(status: tf.Tensor, op_name: str) -> tf.Operation:
    """The graph op that fails with FailedPrecondition when `status` is a refused path: an
    always-true `Assert` on a `ReadFile` of it. The collective's result waits on the Assert,
    which is stateful: a function runs it even when nothing reads the result, and a v1 Session
    keeps it, where it pruned a wait on the ReadFile alone (not stateful) and returned the
    refused op's empty tensors."""
    contents = tf.io.read_file(status, name=f"{op_name}Refused")
    return tf.raw_ops.Assert(condition=True, data=[contents], summarize=0)
