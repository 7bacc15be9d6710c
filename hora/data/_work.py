"""A loader worker's process: it reads the units its rank asks it to (row groups, once, into
shared memory, for all the rank's workers) and makes the batches the rank planned: rows
gathered from the epoch's windows (each the rows of the units that hold it, in its order), then
columns to numpy and the user's `transform`, packed into a segment it reuses.

Messages from the rank (tuples, the kind first): READ (generation, unit, its first row in the
read order, its row groups, whether other workers need it: then into shared memory) and BATCH
(generation, step, the runs of window rows, the units this worker has not been given yet, the
windows it has not been told of) are answered with UNIT and BATCH; DROP lets units go; FREE and
FORGET return batch segments (see `_shared`); None ends the worker. A task of an abandoned
iteration (its generation is not the one wanted) is skipped.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from hora.data._batch import BatchMaker
from hora.data._order import window_permutation
from hora.data._plan import Order, Run
from hora.data._reader import fixed_size, read_piece
from hora.data._rows import concatenated, gather, joined
from hora.data._shared import Lender, share_table, shared_table

if TYPE_CHECKING:
    from hora.data._files import Files

READ, BATCH, DROP, FREE, FORGET, UNIT = "read", "batch", "drop", "free", "forget", "unit"
POLL_SECONDS = 0.5
#: threads of a worker that read units
READERS = 2

#: what a worker is told of a window: its index, first row in the read order, rows, the units
#: that hold them, its order
WindowSpec = tuple[int, int, int, tuple[int, ...], Order]


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
class _Window:
    """A window's rows as the units' tables show them (mapped, not copied), and its order
    (the permutation computed at its first batch here)."""

    spec: WindowSpec
    table: pa.Table | None = None
    permutation: np.ndarray | None = field(default=None)

    def rows(self, units: dict[int, tuple[int, pa.Table]], lo: int, hi: int) -> pa.Table:
        _, start, rows, held, order = self.spec
        if self.table is None:
            parts = []
            for u in held:
                first, table = units[u]
                a = max(start, first) - first
                b = min(start + rows, first + table.num_rows) - first
                parts.append(table.slice(a, b - a))
            self.table = concatenated(parts)
        if order is None:
            return self.table.slice(lo, hi - lo)
        if self.permutation is None:
            seed, epoch, window = order
            self.permutation = window_permutation(window, rows, seed=seed, epoch=epoch)
        return gather(self.table, self.permutation[lo:hi])


class Worker:
    """One worker's state: the units and windows of the iteration it works for, its segments,
    and threads of its own beside the one that makes batches: READERS that read units
    (Parquet's reading and decompression leave the interpreter's lock, so a unit's read
    overlaps the batch being made, and an epoch's first window, which its first batch waits
    for whole, is read two units at once), and one that packs each batch made into a segment
    and sends it (a copy of the whole batch: DataLoader's worker, too, sends from a thread of
    its own). `send` answers the rank from any of them."""

    def __init__(self, index: int, job: Job, send: Callable[[tuple[Any, ...]], None]) -> None:
        self.index = index
        self.job = job
        self.generation = 0
        self.units: dict[int, tuple[int, pa.Table]] = {}  # unit -> (first row, its rows)
        self.windows: dict[int, _Window] = {}
        self.reading: dict[int, threading.Event] = {}  # unit -> set once its read is done
        self.lender = Lender()
        self._send = send
        self._lock = threading.Lock()  # the generation and the units, between the threads
        self._reads: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._readers = [
            threading.Thread(target=self._read_all, name="hora-data-worker-reader", daemon=True)
            for _ in range(READERS)
        ]
        self._packs: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._packer = threading.Thread(
            target=self._pack_all, name="hora-data-worker-packer", daemon=True
        )
        for thread in [*self._readers, self._packer]:
            thread.start()

    def handle(self, message: tuple[Any, ...], wanted: Any, descriptors: Any) -> None:
        """Answer one message of the rank (a READ in the reading thread). The segments of the
        units a BATCH gives come on `descriptors`, a socket, just before it."""
        kind = message[0]
        if kind == BATCH and message[4]:
            message = (*message[:4], _mapped(message[4], descriptors), *message[5:])
        if kind in (FREE, FORGET):
            self._packs.put(message)  # the segments are the packing thread's
            return
        generation = message[1]
        if generation > self.generation:  # a new iteration: the old one's units go
            with self._lock:
                self.units.clear()
                self.windows.clear()
                self.reading.clear()
                self.generation = generation
        if generation != wanted.value:
            return  # its iteration was abandoned
        if kind == DROP:
            self._drop(set(message[2]))
        elif kind == READ:
            done = self.reading[message[2]] = threading.Event()
            self._reads.put((wanted, done, *message[1:]))
        else:
            self._packs.put(self._batch(*message[1:]))

    def _drop(self, units: set[int]) -> None:
        """Let units go, and the windows that show them (no batch needs them any more)."""
        with self._lock:
            for u in units:
                self.units.pop(u, None)
        for w in [w for w, window in self.windows.items() if units & set(window.spec[3])]:
            del self.windows[w]

    def _failure(self) -> Failure:
        return Failure(self.index, os.getpid(), traceback.format_exc())

    def _read_all(self) -> None:
        """The reading thread: each READ's unit, read into shared memory, kept here and told to
        the rank; it ends at None, or when the rank is gone."""
        files: dict[int, Any] = {}
        try:
            while (task := self._reads.get()) is not None:
                wanted, done, generation, *read = task
                try:
                    if generation == wanted.value:  # else abandoned while it waited
                        self._send(self._read(files, generation, *read))
                finally:
                    done.set()  # after its answer: the rank hears of a unit before its batches
        except (OSError, EOFError):
            return  # the rank is gone
        finally:
            for f in files.values():
                f.close()

    def _read(
        self,
        files: dict[int, Any],
        generation: int,
        unit: int,
        first: int,
        pieces: Sequence[int],
        shared: bool,
    ) -> tuple[Any, ...]:
        """A unit read: into shared memory when other workers need it (its segment goes to
        the rank), else kept here as read."""
        storage = None
        try:
            parts = [read_piece(self.job.dataset, p, self.job.columns, files) for p in pieces]
            table = fixed_size(concatenated(parts))
            del parts
            if shared:
                storage = share_table(table)
                table = shared_table(storage)  # the shared copy is the one kept
        except BaseException:
            return (UNIT, generation, unit, self._failure())
        with self._lock:
            if generation == self.generation:
                self.units[unit] = (first, table)
        return (UNIT, generation, unit, storage)

    def _batch(
        self,
        generation: int,
        step: int,
        runs: Sequence[Run],
        given: Sequence[tuple[int, int, Any]],
        told: Sequence[WindowSpec],
    ) -> tuple[Any, ...]:
        with self._lock:
            for unit, first, storage in given:
                self.units[unit] = (first, shared_table(storage))
        del given
        for spec in told:
            self.windows[spec[0]] = _Window(spec)
        try:
            for w in dict.fromkeys(w for w, _, _ in runs):  # units this worker reads itself
                for u in self.windows[w].spec[3]:
                    if u not in self.units and u in self.reading:
                        self.reading[u].wait()
            rows = joined([self.windows[w].rows(self.units, lo, hi) for w, lo, hi in runs])
            return (BATCH, generation, step, self.job.make(rows))
        except BaseException:
            return (BATCH, generation, step, self._failure())

    def _pack_all(self) -> None:
        """The packing thread: each batch made, packed and sent; the segments the rank frees
        or forgets; it ends at None, or when the rank is gone."""
        try:
            while (task := self._packs.get()) is not None:
                if task[0] == FREE:
                    self.lender.free(task[1])
                elif task[0] == FORGET:
                    self.lender.forget(task[1])
                elif isinstance(task[3], Failure):
                    self._send(task)
                else:
                    self._send(self._packed(*task))
        except (OSError, EOFError):
            return  # the rank is gone

    def _packed(self, kind: str, generation: int, step: int, made: Any) -> tuple[Any, ...]:
        try:
            return (kind, generation, step, self.lender.pack(made))
        except BaseException:
            return (kind, generation, step, self._failure())

    def close(self) -> None:
        for _ in self._readers:
            self._reads.put(None)
        self._packs.put(None)
        for thread in [*self._readers, self._packer]:
            thread.join()
        self.windows.clear()
        self.units.clear()


def _mapped(given: Sequence[tuple[int, int, int]], descriptors: Any) -> list[tuple[int, int, Any]]:
    """The units a BATCH gives ((unit, first row, bytes)), each with its segment (its
    descriptor read off the socket)."""
    import socket

    import torch

    _, fds, _, _ = socket.recv_fds(descriptors, 1, len(given))
    mapped = []
    for (unit, first, size), fd in zip(given, fds, strict=True):
        storage = torch.UntypedStorage._new_shared_fd_cpu(fd, size)  # type: ignore[attr-defined]
        mapped.append((unit, first, storage))
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
    sending = threading.Lock()

    def send(reply: tuple[Any, ...]) -> None:
        with sending:
            outputs.send(reply)

    worker = Worker(index, job, send)
    try:
        while True:
            if not inputs.poll(POLL_SECONDS):
                if os.getppid() != parent:
                    return  # the rank died: nothing will read what this worker makes
                continue
            message = inputs.recv()
            if message is None:
                return
            worker.handle(message, wanted, descriptors)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the rank is gone
    finally:
        worker.close()
