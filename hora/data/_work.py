"""A loader worker's process: it reads the units its rank asks it to (once, into shared memory, for
all the rank's workers) and makes the batches the rank planned: rows gathered from the units,
then columns to numpy and the user's `transform`, packed into a segment it reuses.

Messages from the rank (tuples, the kind first): READ (generation, unit, its row groups, its
order) and BATCH (generation, step, the runs of unit rows, the units this worker has not been
given yet) are answered with UNIT and BATCH; DROP lets units go; FREE and FORGET return batch
segments (see `_shared`); None ends the worker. A task of an abandoned iteration (its generation
is not the one wanted) is skipped.
"""

from __future__ import annotations

import os
import signal
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from hora.data._batch import BatchMaker
from hora.data._order import window_permutation
from hora.data._plan import Run
from hora.data._reader import fixed_size, read_piece
from hora.data._rows import gather, joined
from hora.data._shared import Lender, share_table, shared_table

if TYPE_CHECKING:
    from hora.data._files import Files

READ, BATCH, DROP, FREE, FORGET, UNIT = "read", "batch", "drop", "free", "forget", "unit"
POLL_SECONDS = 0.5

#: how a unit's rows are ordered: (seed, epoch, window) of a shuffled window, None: file order
Order = tuple[int, int, int] | None


@dataclass(frozen=True)
class Job:
    """What every worker of a loader is given at its start."""

    make: BatchMaker
    dataset: Files
    columns: tuple[str, ...]


@dataclass(frozen=True)
class Failure:
    worker: int
    pid: int
    traceback: str


@dataclass
class _Held:
    """A unit a worker has mapped, and its rows' order (computed at its first batch)."""

    table: pa.Table
    order: Order
    permutation: np.ndarray | None = field(default=None)

    def rows(self, lo: int, hi: int) -> pa.Table:
        if self.order is None:
            return self.table.slice(lo, hi - lo)
        if self.permutation is None:
            seed, epoch, window = self.order
            self.permutation = window_permutation(
                window, self.table.num_rows, seed=seed, epoch=epoch
            )
        return gather(self.table, self.permutation[lo:hi])


class Worker:
    """One worker's state: the units of the iteration it works for, its open files, its
    segments."""

    def __init__(self, index: int, job: Job) -> None:
        self.index = index
        self.job = job
        self.generation = 0
        self.units: dict[int, _Held] = {}
        self.files: dict[int, Any] = {}
        self.lender = Lender()

    def handle(
        self, message: tuple[Any, ...], wanted: int, descriptors: Any
    ) -> tuple[Any, ...] | None:
        """The reply to one message of the rank (None: nothing to say). The segments of the
        units a BATCH gives come on `descriptors`, a socket, just before it."""
        kind = message[0]
        if kind == BATCH and message[4]:
            message = (*message[:4], _mapped(message[4], descriptors))
        if kind == FREE:
            self.lender.free(message[1])
            return None
        if kind == FORGET:
            self.lender.forget(message[1])
            return None
        generation = message[1]
        if generation > self.generation:  # a new iteration: the old one's units go
            self.units.clear()
            self.generation = generation
        if generation != wanted:
            return None  # its iteration was abandoned
        if kind == DROP:
            for unit in message[2]:
                self.units.pop(unit, None)
            return None
        if kind == READ:
            return self._read(*message[1:])
        return self._batch(*message[1:])

    def _failure(self) -> Failure:
        return Failure(self.index, os.getpid(), traceback.format_exc())

    def _read(
        self, generation: int, unit: int, pieces: Sequence[int], order: Order
    ) -> tuple[Any, ...]:
        try:
            parts = [read_piece(self.job.dataset, p, self.job.columns, self.files) for p in pieces]
            storage = share_table(
                fixed_size(pa.concat_tables(parts) if len(parts) > 1 else parts[0])
            )
            del parts  # the shared copy is the one kept
            self.units[unit] = _Held(shared_table(storage), order)
        except BaseException:
            return (UNIT, generation, unit, self._failure())
        return (UNIT, generation, unit, storage)

    def _batch(
        self,
        generation: int,
        step: int,
        runs: Sequence[Run],
        given: Sequence[tuple[int, Any, Order]],
    ) -> tuple[Any, ...]:
        for unit, storage, order in given:
            self.units[unit] = _Held(shared_table(storage), order)
        del given
        try:
            rows = joined([self.units[u].rows(lo, hi) for u, lo, hi in runs])
            packed = self.lender.pack(self.job.make(rows))
        except BaseException:
            return (BATCH, generation, step, self._failure())
        return (BATCH, generation, step, packed)

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files.clear()
        self.units.clear()


def _mapped(
    given: Sequence[tuple[int, int, Order]], descriptors: Any
) -> list[tuple[int, Any, Order]]:
    """The units a BATCH gives, each with its segment (its descriptor read off the socket)."""
    import socket

    import torch

    _, fds, _, _ = socket.recv_fds(descriptors, 1, len(given))
    mapped = []
    for (unit, size, order), fd in zip(given, fds, strict=True):
        storage = torch.UntypedStorage._new_shared_fd_cpu(fd, size)  # type: ignore[attr-defined]
        mapped.append((unit, storage, order))
        os.close(fd)  # the storage keeps a descriptor of its own
    return mapped


def work(
    index: int,
    inputs: Any,
    outputs: Any,
    descriptors: Any,
    payload: Any,
    wanted: Any,
    parent: int,
    others: Sequence[Any],
) -> None:
    """A worker's loop: answer the rank's messages until told to stop or the rank is gone.
    `others`: the pipe ends this process inherited but does not use (closed at once, so that
    a rank's death is an end of file here, and a worker's there)."""
    import torch

    for end in others:
        end.close()
    torch.set_num_threads(1)  # K workers beside the rank: one core each (as DataLoader's)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the rank's to handle
    job = payload
    if isinstance(payload, bytes):
        import cloudpickle

        job = cloudpickle.loads(payload)
    worker = Worker(index, job)
    try:
        while True:
            if not inputs.poll(POLL_SECONDS):
                if os.getppid() != parent:
                    return  # the rank died: nothing will read what this worker makes
                continue
            message = inputs.recv()
            if message is None:
                return
            reply = worker.handle(message, wanted.value, descriptors)
            if reply is not None:
                outputs.send(reply)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the rank is gone
    finally:
        worker.close()
