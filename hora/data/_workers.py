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
from hora.data._plan import Run, Unit
from hora.data._shared import Borrower
from hora.data._work import (
    BATCH,
    DROP,
    FORGET,
    FREE,
    READ,
    UNIT,
    Failure,
    Job,
    Order,
    work,
)

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


class _Iteration:
    """One iteration's bookkeeping: the units to read, read and being read, who holds them."""

    def __init__(self, generation: int, plan: Sequence[Sequence[Run]], found: Sequence[Unit]):
        self.generation = generation
        self.plan = plan
        self.found = found
        first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        for step, runs in enumerate(plan):
            for u, _, _ in runs:
                first.setdefault(u, step)
                self.last[u] = step
        self.to_read = collections.deque(sorted(first, key=first.__getitem__))
        self.ready: dict[int, Any] = {}
        self.holders: dict[int, set[int]] = collections.defaultdict(set)
        self.held = 0  # bytes of the units read or being read, not yet let go
        self.results: dict[int, dict[str, Any]] = {}

    def units(self, step: int) -> list[int]:
        return list(dict.fromkeys(u for u, _, _ in self.plan[step]))

    def can_make(self, step: int) -> bool:
        return all(u in self.ready for u in self.units(step))


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
        plan: Sequence[Sequence[Run]],
        found: Sequence[Unit],
        orders: Sequence[Order],
        budget: int,
        where: Callable[[Sequence[Run]], str],
    ) -> Iterator[dict[str, Any]]:
        """The batches of `plan` (each runs of rows of the units `found`, ordered by `orders`),
        in order. Units are read ahead while those held fit `budget`; at least one batch is in
        flight, more while the results expected of them fit it too. `where(runs)` names a
        batch's row groups in an error."""
        self._check()
        self._generation += 1
        self._wanted.value = self._generation
        for doing in self._doing:
            doing.clear()
        it = _Iteration(self._generation, plan, found)
        pending: collections.deque[int] = collections.deque()
        sent = result_bytes = 0
        try:
            while True:
                self._give_back()
                self._read_ahead(it, orders, budget, sent)
                while sent < len(plan) and len(pending) < _PER_WORKER * self.count:
                    more = (len(pending) + 1) * result_bytes <= budget
                    if (pending and not more) or not it.can_make(sent):
                        break
                    self._send_batch(it, sent, orders)
                    pending.append(sent)
                    sent += 1
                if not pending:
                    if sent == len(plan):
                        return
                    self._wait(it, where)  # for a unit of batch `sent`
                    continue
                step = pending[0]
                while step not in it.results:
                    self._wait(it, where)
                pending.popleft()
                arrays = it.results.pop(step)
                result_bytes = max(result_bytes, _nbytes(arrays))
                self._let_go(it, [u for u in it.units(step) if it.last[u] == step])
                yield arrays
        finally:
            if not self._broken:
                self._let_go(it, list(it.ready))

    def _send(self, worker: int, message: tuple[Any, ...]) -> None:
        self._inputs[worker].send(message)

    def _read_ahead(self, it: _Iteration, orders: Sequence[Order], budget: int, step: int) -> None:
        """Read the units batch `step` needs, then the next ones while they fit `budget`."""
        needed = set(it.units(step)) if step < len(it.plan) else set()
        while it.to_read:
            u = it.to_read[0]
            size = it.found[u].bytes
            if u not in needed and it.held and it.held + size > budget:
                return
            worker = min(range(self.count), key=lambda w: len(self._doing[w]))
            pieces = it.found[u].pieces
            self._send(worker, (READ, it.generation, u, pieces, orders[u]))
            self._doing[worker].append((it.generation, READ, u))
            it.to_read.popleft()
            it.held += size

    def _send_batch(self, it: _Iteration, step: int, orders: Sequence[Order]) -> None:
        worker = step % self.count
        given, descriptors = [], []
        for u in it.units(step):
            if worker not in it.holders[u]:
                descriptor, size = it.ready[u]._share_fd_cpu_()  # the segment's own: no copy
                given.append((u, size, orders[u]))
                descriptors.append(descriptor)
                it.holders[u].add(worker)
        if descriptors:  # passed beside the message, before it (no thread of the rank's serves
            # them, as pickling a segment would start: multiprocessing's resource sharer)
            socket.send_fds(self._descriptors[worker], [bytes([len(descriptors)])], descriptors)
        self._send(worker, (BATCH, it.generation, step, it.plan[step], given))
        self._doing[worker].append((it.generation, BATCH, step))

    def _let_go(self, it: _Iteration, units: Sequence[int]) -> None:
        """Units no batch of this iteration needs any more: unmapped here and in the workers."""
        by_worker: dict[int, list[int]] = collections.defaultdict(list)
        for u in units:
            if it.ready.pop(u, None) is not None:
                it.held -= it.found[u].bytes
                for worker in it.holders.pop(u, ()):
                    by_worker[worker].append(u)
        for worker, dropped in by_worker.items():
            with contextlib.suppress(OSError):  # a worker gone: it unmapped them with its end
                self._send(worker, (DROP, it.generation, dropped))

    def _give_back(self) -> None:
        """Tell the workers which of their segments the loop let go (or no longer watched)."""
        free, forget = self._borrower.released()
        for kind, found in ((FREE, free), (FORGET, forget)):
            for worker, numbers in found.items():
                with contextlib.suppress(OSError):
                    self._send(worker, (kind, numbers))

    def _wait(self, it: _Iteration, where: Callable[[Sequence[Run]], str]) -> None:
        """Take whatever the workers answered (waiting up to a poll's time for something)."""
        ready = multiprocessing.connection.wait(self._outputs, timeout=_POLL_SECONDS)
        if not ready:
            for worker, process in enumerate(self._processes):
                if not process.is_alive():
                    self._died(worker, it, where)
        for found in ready:
            worker = next(i for i, c in enumerate(self._outputs) if c is found)
            try:
                message = self._outputs[worker].recv()
            except (EOFError, OSError):  # its end of the pipe closed: it died
                self._processes[worker].join(timeout=_POLL_SECONDS)
                self._died(worker, it, where)
            self._take(worker, message, it, where)

    def _take(
        self,
        worker: int,
        message: tuple[Any, ...],
        it: _Iteration,
        where: Callable[[Sequence[Run]], str],
    ) -> None:
        kind, generation, key, payload = message
        with contextlib.suppress(ValueError):
            self._doing[worker].remove((generation, kind if kind == BATCH else READ, key))
        current = generation == it.generation
        if isinstance(payload, Failure):
            if not current:
                return
            what = f"making batch {key} from {where(it.plan[key])}"
            if kind == UNIT:
                what = f"reading {where([(key, 0, it.found[key].rows)])}"
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

    def _died(self, worker: int, it: _Iteration, where: Callable[[Sequence[Run]], str]) -> NoReturn:
        process = self._processes[worker]
        doing = [d for d in self._doing[worker] if d[0] == it.generation]
        what = "while idle"
        if doing and doing[0][1] == BATCH:
            what = f"while making batch {doing[0][2]} from {where(it.plan[doing[0][2]])}"
        elif doing:
            u = doing[0][2]
            what = f"while reading {where([(u, 0, it.found[u].rows)])}"
        self._broken = (
            f"hora.data's loader worker {worker} (pid {process.pid}) died "
            f"({_exit_reason(process.exitcode)}) {what}; the loader's workers are gone (a "
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
        for connection in self._inputs + self._outputs:
            connection.close()
        for end in self._descriptors:
            end.close()


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _nbytes(arrays: dict[str, Any]) -> int:
    return sum(int(getattr(v, "nbytes", 0)) for v in arrays.values())
