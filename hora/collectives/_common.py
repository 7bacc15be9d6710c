"""Constants and errors shared by every module of hora.collectives and its framework APIs."""

from __future__ import annotations

# Reduction ops are plain ints, as in Horovod.
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

OP_NAMES = {
    Average: "Average",
    Sum: "Sum",
    Adasum: "Adasum",
    Min: "Min",
    Max: "Max",
    Product: "Product",
}

NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."
SHUT_DOWN = (
    "Horovod has been shut down. This was caused by an exception on one of the ranks or an "
    "attempt to run a collective after one of the ranks finished execution."
)


class HorovodInternalError(RuntimeError):
    """A collective failed: raised on every rank (mismatch, dead peer, shutdown)."""


class CollectiveRefusedError(HorovodInternalError):
    """The coordinator refused an operation (the ranks disagree on its shape, dtype, op or root,
    or it cannot run during a join): every member raises it and the loop goes on. Horovod's
    precondition error, which its TensorFlow ops raise as tf.errors.FailedPreconditionError."""


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by elastic code when the set of hosts changed (kept for API compatibility)."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts updated")
        self.skip_sync = skip_sync
