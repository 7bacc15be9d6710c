"""A loader's worker processes: they turn the batches the rank's reader cut into what the loop
gets (columns to numpy, then the user's `transform`: image decoding, tokenizing), in parallel,
and hand them back through shared memory, in order.

The rank keeps everything that decides *which* rows a batch holds (the epoch's order, the
shares, the position a commit saves); a worker only makes batch `step` of the iteration it was
given, so batches are the same with workers as without, and exactly-once, resume and resize do
not depend on them. Batch `step` goes to worker `step % K` (each worker's batches come back in
its order), at most `2 * K` batches and a byte budget in flight. Tensors come back in torch's
shared memory (a file descriptor passed over a socket, its name unlinked at once: nothing is
left in /dev/shm when a process dies). A worker ends when its rank ends or dies (it watches its
parent), and a worker that dies fails the rank's next batch with what it was making.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import os
import queue
import signal
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import pyarrow as pa

from hora import environment
from hora.data._batch import BatchMaker

#: the most workers a loader starts by itself: more rarely pays on one rank's share of a host
MAX_DEFAULT_WORKERS = 8
_POLL_SECONDS = 0.5
#: batches in flight per worker (torch DataLoader's prefetch_factor)
_PER_WORKER = 2


class LoaderWorkerError(RuntimeError):
    """A loader's worker process raised or died while making a batch; the message has the
    worker's traceback and the row groups the batch was read from."""


def default_workers(has_transform: bool) -> int:
    """Workers for `num_workers=None`: none without a transform (the reader's thread already
    reads ahead and a batch's conversion is a copy or less); with one, this rank's share of the
    host's cores less the rank's own, at least 1, at most MAX_DEFAULT_WORKERS."""
    if not has_transform:
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    placement = environment.current().placement
    ranks_here = placement.local_size if placement is not None else 1
    return max(1, min(MAX_DEFAULT_WORKERS, (cores or 1) // max(1, ranks_here) - 1))


@dataclass(frozen=True)
class _Failure:
    worker: int
    pid: int
    traceback: str


class WorkerPool:
    """`count` processes making batches with `make`; started once per loader, used by every
    epoch (each iteration is a new generation: batches of an abandoned one are dropped)."""

    def __init__(self, count: int, make: BatchMaker) -> None:
        import torch.multiprocessing  # noqa: F401  (registers tensors' shared-memory pickling)

        forking = "fork" in multiprocessing.get_all_start_methods()
        context: Any = multiprocessing.get_context("fork" if forking else "spawn")
        payload: Any = make
        if not forking:  # the transform may be a closure: cloudpickle, as hora ships functions
            import cloudpickle

            payload = cloudpickle.dumps(make)
        self.count = count
        self._wanted = context.Value("q", 0, lock=False)  # the generation workers make
        self._generation = 0
        self._inputs = [context.Queue() for _ in range(count)]
        self._outputs = [context.Queue() for _ in range(count)]
        self._processes = [
            context.Process(
                target=_work,
                args=(i, self._inputs[i], self._outputs[i], payload, self._wanted, os.getpid()),
                name=f"hora-data-worker-{i}",
                daemon=True,
            )
            for i in range(count)
        ]
        for process in self._processes:
            process.start()
        self._broken: str | None = None
        self._closed = False

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes if p.pid is not None]

    def batches(
        self,
        raw: Iterator[tuple[pa.Table, Any]],
        budget: int,
        where: Callable[[Any], str],
    ) -> Iterator[dict[str, Any]]:
        """What `make` gives for each raw batch of `raw`, in order. `raw` yields (table, origin);
        `where(origin)` names the batch's row groups in an error. At least one batch is in
        flight; more while the raw batches and the results expected of them fit `budget`."""
        self._check()
        self._generation += 1
        generation = self._generation
        self._wanted.value = generation
        pending: collections.deque[tuple[int, Any, int]] = collections.deque()
        waiting: tuple[pa.Table, Any] | None = None
        sent = raw_held = result_bytes = 0
        while True:
            while len(pending) < _PER_WORKER * self.count:
                if waiting is None:
                    waiting = next(raw, None)
                    if waiting is None:
                        break
                size = waiting[0].nbytes
                ahead = raw_held + size + (len(pending) + 1) * result_bytes
                if pending and ahead > budget:
                    break
                self._inputs[sent % self.count].put((generation, sent, _compact(waiting[0])))
                pending.append((sent, waiting[1], size))
                raw_held += size
                sent += 1
                waiting = None
            if not pending:
                return
            step, origin, size = pending.popleft()
            raw_held -= size
            result = self._receive(step, generation, origin, where)
            result_bytes = max(result_bytes, _nbytes(result))
            yield result

    def _check(self) -> None:
        if self._broken is not None:
            raise LoaderWorkerError(self._broken)

    def _receive(
        self, step: int, generation: int, origin: Any, where: Callable[[Any], str]
    ) -> dict[str, Any]:
        worker = step % self.count
        process, outputs = self._processes[worker], self._outputs[worker]
        while True:
            try:
                made, got, payload = outputs.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if process.is_alive():
                    continue
                self._died(worker, step, where(origin))
            except Exception:  # a dying worker's tensor, no longer there to fetch
                process.join(timeout=_POLL_SECONDS)
                if process.is_alive():
                    raise
                self._died(worker, step, where(origin))
            if made != generation:
                continue  # a batch of an iteration that was abandoned
            assert got == step, (got, step)
            if isinstance(payload, _Failure):
                raise LoaderWorkerError(
                    f"hora.data's loader worker {payload.worker} (pid {payload.pid}) raised "
                    f"while making batch {step} from {where(origin)}:\n{payload.traceback}"
                )
            arrays, from_numpy = payload
            return {k: v.numpy() if k in from_numpy else v for k, v in arrays.items()}

    def _died(self, worker: int, step: int, where: str) -> NoReturn:
        process = self._processes[worker]
        self._broken = (
            f"hora.data's loader worker {worker} (pid {process.pid}) died "
            f"({_exit_reason(process.exitcode)}) while making batch {step} from {where}; the "
            "loader's workers are gone (a killed worker is often the kernel's out-of-memory "
            "killer: lower num_workers or prefetch, or num_workers=0 to make batches in the "
            "training thread)"
        )
        self.close()
        raise LoaderWorkerError(self._broken)

    def close(self) -> None:
        """End the workers (at once where they do not stop within a moment); again: nothing."""
        if self._closed:
            return
        self._closed = True
        self._wanted.value = -1
        for inputs, process in zip(self._inputs, self._processes, strict=True):
            if process.is_alive():
                inputs.put(None)
        for process in self._processes:
            process.join(timeout=2)
            if process.is_alive():
                process.kill()
                process.join()
        for inputs, process in zip(self._inputs, self._processes, strict=True):
            if process.exitcode:  # killed with batches unread: the rank reads them itself,
                with contextlib.suppress(queue.Empty, OSError, EOFError):  # or its feeder
                    while True:  # thread would wait on a full pipe for ever
                        inputs.get(timeout=0.2)
            inputs.close()  # the feeder thread ends once what it holds is in the pipe
            inputs.join_thread()
        for outputs in self._outputs:
            outputs.close()


def _compact(table: pa.Table) -> pa.Table:
    """The table holding only its own rows: a batch is often a slice of a window, and pickling
    a slice sends every buffer it points into (a window's 60 MB for a 2 MB batch of JPEGs)."""
    if table.get_total_buffer_size() <= 2 * table.nbytes:
        return table
    return table.take(pa.array(np.arange(table.num_rows)))


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _nbytes(arrays: dict[str, Any]) -> int:
    return sum(int(getattr(v, "nbytes", 0)) for v in arrays.values())


def _work(
    index: int,
    inputs: Any,
    outputs: Any,
    payload: Any,
    wanted: Any,
    parent: int,
) -> None:
    """A worker's loop: make the batches it is given until told to stop or its rank is gone."""
    import torch

    torch.set_num_threads(1)  # K workers beside the rank: one core each (as DataLoader's)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the rank's to handle
    outputs.cancel_join_thread()  # ending never waits on a pipe its dead rank no longer reads
    make = payload
    if isinstance(payload, bytes):
        import cloudpickle

        make = cloudpickle.loads(payload)
    while True:
        try:
            task = inputs.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            if os.getppid() != parent:
                return  # the rank died: nothing will read what this worker makes
            continue
        if task is None:
            return
        generation, step, table = task
        if generation != wanted.value:
            continue  # its iteration was abandoned
        try:
            arrays = make(table)
            shared = {k: _shared(torch, v) for k, v in arrays.items()}
            from_numpy = {k for k, v in arrays.items() if shared[k] is not v}
        except BaseException:
            outputs.put((generation, step, _Failure(index, os.getpid(), traceback.format_exc())))
            continue
        outputs.put((generation, step, (shared, from_numpy)))


def _shared(torch: Any, value: Any) -> Any:
    """A numpy array as a tensor in shared memory (copied once, here, into a segment made for
    it, which the rank maps); other values (tensors are shared by torch's pickling, lists
    pickled) as they are."""
    if not isinstance(value, np.ndarray) or value.dtype == object:
        return value
    try:
        dtype = torch.from_numpy(np.empty(0, dtype=value.dtype)).dtype
    except TypeError:  # a dtype torch has no tensor for: pickled as numpy
        return value
    # a new segment written once, as DataLoader's collate does: `empty().share_memory_()`
    # would fill a private buffer first and copy it over, twice the page faults
    storage = torch.UntypedStorage._new_shared(max(1, value.nbytes))
    tensor = torch.empty(0, dtype=dtype).set_(storage, 0, value.shape)
    tensor.numpy()[...] = value
    return tensor
