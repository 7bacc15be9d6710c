"""A loader's worker processes, seen from the rank: they read the rows and make the batches the
rank planned, in parallel, and hand them back through shared memory, in order.

The rank keeps everything that decides *which* rows a batch holds (the epoch's order, the
shares, the position a commit saves) and sends plans, never rows: "read unit u" (a shuffled
window, or a run of row groups in file order: read once, by one worker, into shared memory, and
mapped by every worker that needs its rows) and "make batch k from these runs of unit rows". So
batches are the same with workers as without, and exactly-once, resume and resize do not depend
on them. Batch k goes to worker k % K (each worker answers in its order); a unit goes to the
worker with the least to do, read ahead while the units held fit the byte budget; at most 2 K
batches are in flight. A worker ends when its rank ends or dies (it watches its parent, and its
pipe), and a worker that dies fails the rank's next batch with what it was making.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

from hora import environment
from hora.data._plan import Plan, Run
from hora.data._shared import Borrower, remove_names_left
from hora.data._work import (
    BATCH,
    DROP,
    FORGET,
    FREE,
    READ,
    UNIT,
    Failure,
    Job,
    work,
)

#: the most workers a loader starts by itself: more rarely pays on one rank's share of a host
MAX_DEFAULT_WORKERS = 8
_POLL_SECONDS = 0.5
#: batches in flight per worker (torch DataLoader's prefetch_factor)
_PER_WORKER = 2
#: what names row groups in an error: a batch's (by its runs), a unit's
_Names = tuple[Callable[[Sequence[Run]], str], Callable[[int], str]]


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


class _Iteration:
    """One iteration's bookkeeping: the units to read, read and being read, who holds them,
    which windows each worker was told of."""

    def __init__(self, generation: int, plan: Plan, workers: int, names: _Names) -> None:
        self.generation = generation
        self.plan = plan
        self.names = names
        self.first: dict[int, int] = {}  # unit -> the first batch that needs it
        self.last: dict[int, int] = {}
        self.users: dict[int, set[int]] = collections.defaultdict(set)  # unit -> its workers
        for step in range(len(plan.batches)):
            for u in plan.units_of(step):
                self.first.setdefault(u, step)
                self.last[u] = step
                self.users[u].add(step % workers)
        self.to_read = collections.deque(sorted(self.first, key=self.first.__getitem__))
        self.ready: dict[int, Any] = {}
        self.holders: dict[int, set[int]] = collections.defaultdict(set)
        self.reader: dict[int, int] = {}  # unit -> the worker reading it
        self.told: dict[int, set[int]] = collections.defaultdict(set)
        self.held = 0  # bytes of the units read or being read, not yet let go
        self.results: dict[int, dict[str, Any]] = {}

    def can_make(self, step: int, worker: int) -> bool:
        """Whether every unit batch `step` needs is read, or is being read by `worker`, whose
        batch waits for it there (no round trip through the rank)."""
        return all(
            u in self.ready or self.reader.get(u) == worker for u in self.plan.units_of(step)
        )


class WorkerPool:
    """`count` processes reading and making batches for `job`; started once per loader, used
    by every epoch (each iteration is a new generation: answers of an abandoned one are
    dropped)."""

    def __init__(self, count: int, job: Job) -> None:
        import torch.multiprocessing  # noqa: F401  (registers tensors' shared-memory pickling)

        forking = "fork" in multiprocessing.get_all_start_methods()
        context: Any = multiprocessing.get_context("fork" if forking else "spawn")
        payload: Any = job
        if not forking:  # the transform may be a closure: cloudpickle, as hora ships functions
            import cloudpickle

            payload = cloudpickle.dumps(job)
        self.count = count
        self._wanted = context.Value("q", 0, lock=False)  # the generation workers work for
        self._generation = 0
        inputs = [context.Pipe(duplex=False) for _ in range(count)]  # (worker's, rank's)
        outputs = [context.Pipe(duplex=False) for _ in range(count)]  # (rank's, worker's)
        sockets = [socket.socketpair() for _ in range(count)]  # units' descriptors
        self._inputs = [send for _, send in inputs]
        self._outputs = [receive for receive, _ in outputs]
        self._descriptors = [mine for mine, _ in sockets]
        ends = [end for pair in inputs + outputs + sockets for end in pair]
        self._processes = []
        for i in range(count):
            own = (inputs[i][0], outputs[i][1], sockets[i][1])
            others = [e for e in ends if all(e is not o for o in own)] if forking else []
            self._processes.append(
                context.Process(
                    target=work,
                    args=(i, *own, payload, self._wanted, os.getpid(), others),
                    name=f"hora-data-worker-{i}",
                    daemon=True,
                )
            )
        for process in self._processes:
            process.start()
        for theirs in [r for r, _ in inputs] + [w for _, w in outputs + sockets]:
            theirs.close()
        self._borrower = Borrower()
        self._doing: list[collections.deque[tuple[int, str, int]]] = [
            collections.deque() for _ in range(count)
        ]
        self._broken: str | None = None
        self._closed = False

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes if p.pid is not None]

    def batches(
        self,
        plan: Plan,
        budget: int,
        where: Callable[[Sequence[Run]], str],
        where_unit: Callable[[int], str],
    ) -> Iterator[dict[str, Any]]:
        """The batches of `plan`, in order. Units are read ahead while those held fit `budget`;
        at least one batch is in flight, more while the results expected of them fit it too.
        `where(runs)` and `where_unit(unit)` name row groups in an error."""
        self._check()
        self._generation += 1
        self._wanted.value = self._generation
        for doing in self._doing:
            doing.clear()
        it = _Iteration(self._generation, plan, self.count, (where, where_unit))
        pending: collections.deque[int] = collections.deque()
        sent = result_bytes = 0
        try:
            while True:
                self._give_back()
                self._read_ahead(it, budget, sent)
                while sent < len(plan.batches) and len(pending) < _PER_WORKER * self.count:
                    more = (len(pending) + 1) * result_bytes <= budget
                    if (pending and not more) or not it.can_make(sent, sent % self.count):
                        break
                    self._send_batch(it, sent)
                    pending.append(sent)
                    sent += 1
                if not pending and sent == len(plan.batches):
                    return
                step = pending[0] if pending else None
                if step not in it.results:  # (None: batch `sent` waits for a unit)
                    self._wait(it)
                    continue  # what came may let more batches go out
                pending.popleft()
                arrays = it.results.pop(step)
                result_bytes = max(result_bytes, _nbytes(arrays))
                self._let_go(it, [u for u in plan.units_of(step) if it.last[u] == step])
                yield arrays
        finally:
            if not self._broken:
                self._let_go(it, list(it.ready))

    def _send(self, it: _Iteration, worker: int, message: tuple[Any, ...], fds: Any = ()) -> None:
        """A message to a worker (its units' descriptors first, on the socket beside the pipe:
        no thread of the rank's serves them, as pickling a segment would start); a worker
        found dead by it fails the loop as a death found waiting would."""
        try:
            if fds:
                socket.send_fds(self._descriptors[worker], [bytes([len(fds)])], fds)
            self._inputs[worker].send(message)
        except OSError:
            self._processes[worker].join(timeout=_POLL_SECONDS)
            if self._processes[worker].is_alive():
                raise
            self._died(worker, it)

    def _read_ahead(self, it: _Iteration, budget: int, step: int) -> None:
        """Read the units batch `step` needs, then those of the batches sent after it, 2 K
        batches ahead at most, while they fit `budget` (a read queued behind a worker's batches
        delays them: no further ahead). A unit only one worker's batches need is read by that
        worker, for itself; another into shared memory, by the worker with the least to do."""
        horizon = step + _PER_WORKER * self.count
        while it.to_read:
            u = it.to_read[0]
            unit = it.plan.units[u]
            needed = it.first[u] <= step
            if not needed and (it.first[u] >= horizon or it.held + unit.bytes > budget):
                return
            users = it.users[u]
            if len(users) == 1:  # one worker's batches need it: that worker reads it for itself
                (worker,) = users
            else:
                worker = min(range(self.count), key=lambda w: len(self._doing[w]))
            shared = len(users) > 1
            self._send(it, worker, (READ, it.generation, u, unit.start, unit.pieces, shared))
            self._doing[worker].append((it.generation, READ, u))
            it.reader[u] = worker
            it.holders[u].add(worker)
            it.to_read.popleft()
            it.held += unit.bytes

    def _send_batch(self, it: _Iteration, step: int) -> None:
        """Batch `step` to worker step % K, with the units and windows it lacks."""
        worker = step % self.count
        plan = it.plan
        given, descriptors = [], []
        for u in plan.units_of(step):
            if worker not in it.holders[u]:
                descriptor, size = it.ready[u]._share_fd_cpu_()  # the segment's own: no copy
                given.append((u, plan.units[u].start, size))
                descriptors.append(descriptor)
                it.holders[u].add(worker)
        told = []
        for w in plan.windows_of(step):
            if w not in it.told[worker]:
                window = plan.windows[w]
                covering = tuple(plan.covering[w])
                told.append((w, window.start, window.rows, covering, plan.orders[w]))
                it.told[worker].add(w)
        message = (BATCH, it.generation, step, plan.batches[step], given, told)
        self._send(it, worker, message, descriptors)
        self._doing[worker].append((it.generation, BATCH, step))

    def _let_go(self, it: _Iteration, units: Sequence[int]) -> None:
        """Units no batch of this iteration needs any more: unmapped here and in the workers."""
        by_worker: dict[int, list[int]] = collections.defaultdict(list)
        for u in units:
            if u in it.ready:
                del it.ready[u]
                it.held -= it.plan.units[u].bytes
                for worker in it.holders.pop(u, ()):
                    by_worker[worker].append(u)
        for worker, dropped in by_worker.items():
            with contextlib.suppress(OSError):  # a worker gone: it unmapped them with its end
                self._inputs[worker].send((DROP, it.generation, dropped))

    def _give_back(self) -> None:
        """Tell the workers which of their segments the loop let go (or no longer watched)."""
        free, forget = self._borrower.released()
        for kind, found in ((FREE, free), (FORGET, forget)):
            for worker, numbers in found.items():
                with contextlib.suppress(OSError):  # a worker gone: found by the next wait
                    self._inputs[worker].send((kind, numbers))

    def _wait(self, it: _Iteration) -> None:
        """Take whatever the workers answered (waiting up to a poll's time for something)."""
        ready = multiprocessing.connection.wait(self._outputs, timeout=_POLL_SECONDS)
        if not ready:
            for worker, process in enumerate(self._processes):
                if not process.is_alive():
                    self._died(worker, it)
        for found in ready:
            worker = next(i for i, c in enumerate(self._outputs) if c is found)
            try:
                message = self._outputs[worker].recv()
            except (EOFError, OSError):  # its end of the pipe closed: it died
                self._processes[worker].join(timeout=_POLL_SECONDS)
                self._died(worker, it)
            self._take(worker, message, it)

    def _take(
        self,
        worker: int,
        message: tuple[Any, ...],
        it: _Iteration,
    ) -> None:
        kind, generation, key, payload = message
        with contextlib.suppress(ValueError):
            self._doing[worker].remove((generation, kind if kind == BATCH else READ, key))
        current = generation == it.generation
        if isinstance(payload, Failure):
            if not current:
                return
            what = _doing(it, kind if kind == BATCH else READ, key)
            raise LoaderWorkerError(
                f"hora.data's loader worker {payload.worker} (pid {payload.pid}) raised while "
                f"{what}:\n{payload.traceback}"
            )
        if kind == UNIT:
            if current:
                it.ready[key] = payload
                it.holders[key].add(worker)
            return
        arrays = self._borrower.unpack(worker, payload)  # a stale batch's segment is freed next
        if current:
            it.results[key] = arrays

    def _check(self) -> None:
        if self._broken is not None:
            raise LoaderWorkerError(self._broken)

    def _died(self, worker: int, it: _Iteration) -> NoReturn:
        process = self._processes[worker]
        doing = [d for d in self._doing[worker] if d[0] == it.generation]
        what = "idle" if not doing else _doing(it, doing[0][1], doing[0][2])
        self._broken = (
            f"hora.data's loader worker {worker} (pid {process.pid}) died "
            f"({_exit_reason(process.exitcode)}) while {what}; the loader's workers are gone (a "
            "killed worker is often the kernel's out-of-memory killer: lower num_workers or "
            "prefetch, or num_workers=0 to make batches in the training thread)"
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
                with contextlib.suppress(OSError):
                    inputs.send(None)
        for process in self._processes:
            process.join(timeout=2)
            if process.is_alive():
                process.kill()
                process.join()
            remove_names_left(process.pid)  # a worker killed while it made a segment
        for connection in self._inputs + self._outputs:
            connection.close()
        for end in self._descriptors:
            end.close()


def _doing(it: _Iteration, kind: str, key: int) -> str:
    """What a worker was doing, with the row groups it read."""
    if kind == BATCH:
        return f"making batch {key} from {it.names[0](it.plan.batches[key])}"
    return f"reading {it.names[1](key)}"


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _nbytes(arrays: dict[str, Any]) -> int:
    return sum(int(getattr(v, "nbytes", 0)) for v in arrays.values())
