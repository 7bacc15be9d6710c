"""A rank's loader: its share of each epoch's order, in batches of torch tensors, resumable.

Ranks step in lockstep (every rank yields the same number of batches), so after k batches every
rank knows what the whole world has consumed. `state_dict()` is that: the epoch and the
positions of its order no rank has consumed, the same on every rank. `load_state_dict()` in a
world of any size splits those positions again: an elastic resize trains each row once per
epoch, and a restart resumes exactly where the commit was made.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import threading
import warnings
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hora import environment
from hora.data import _order, _plan
from hora.data._batch import BatchMaker, Transform
from hora.data._columns import ARRAY, ColumnError, check_selected
from hora.data._device import Feeder, PinnedPool, to_device
from hora.data._reader import Reader
from hora.data._rows import batches_of
from hora.data._work import Job
from hora.data._workers import WorkerPool, default_workers

if TYPE_CHECKING:
    from hora.data._files import Files

#: the default prefetch budget of a loader, in bytes: decoded data its reader may hold at once
DEFAULT_PREFETCH = 256 << 20
_STATE_VERSION = 1


class Loader:
    """This rank's batches of a `hora.data.Dataset` (see `Dataset.loader`).

    Iterate for one epoch's batches (dicts of tensors by column); iterating after an epoch has
    ended starts the next one, or call `set_epoch(e)`. The batches of a rank are contiguous runs
    of the epoch's order: rows shuffled by row group and within a window of row groups
    (`prefetch // 4` bytes), the same order on every rank for one (seed, epoch).

    `num_workers` processes make the batches (columns to numpy, `transform`) in parallel: the
    same batches as `num_workers=0` (in the training thread); None picks a number from the
    host's cores and its ranks when there is a transform, else 0. `pin_memory`/`device` copy
    each batch to the GPU while the loop trains on the one before. `close()` ends the workers
    (so does the loader's end, and the rank's).
    """

    #: hora.torch.elastic.TorchState commits and syncs a value that says this (its position)
    hora_resumable = True

    def __init__(
        self,
        dataset: Files,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        columns: Sequence[str] | None = None,
        transform: Transform | None = None,
        prefetch: int = DEFAULT_PREFETCH,
        pad: Mapping[str, int] | None = None,
        rank: int | None = None,
        size: int | None = None,
        num_workers: int | None = None,
        pin_memory: bool = False,
        device: Any = None,
    ) -> None:
        for name, value, least in (("batch_size", batch_size, 1), ("prefetch", prefetch, 1 << 16)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle, self.seed, self.drop_last = bool(shuffle), int(seed), bool(drop_last)
        self.columns = list(columns) if columns is not None else [c.name for c in dataset.columns]
        self.transform = transform
        self.prefetch = prefetch
        self.pad = {**dataset.pad, **(pad or {})}
        self._by_name = {c.name: c for c in dataset.columns}
        check_selected(self._by_name, self.columns, transform is not None)
        self._check_lengths()
        here = environment.current()
        self.rank = here.rank or 0 if rank is None else rank
        self.size = here.size or 1 if size is None else size
        #: rank and size are the process's: a world re-formed in place rewrites them
        self._follows_world = rank is None and size is None
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} is not in a world of {self.size}")
        if dataset.rows < self.size:
            raise ValueError(
                f"the dataset has {dataset.rows} rows for {self.size} ranks: every rank needs "
                "at least one row; use fewer ranks or more data"
            )
        dataset.check_reachable(self.rank)
        self._rows = dataset.rows
        self._window_bytes = max(1, prefetch // 4)
        self.epoch = 0
        self._remaining: list[_order.Interval] = [(0, self._rows)]
        self._ended = False  # resumed at an epoch's end: nothing left of it (see set_epoch)
        if num_workers is None:
            num_workers = default_workers(transform is not None)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an int >= 0 or None, got {num_workers!r}")
        self.num_workers = num_workers
        self.pin_memory, self.device = bool(pin_memory), device
        self._make = BatchMaker(self._by_name, self.pad, transform)
        self._pool: WorkerPool | None = None
        self._feeding: Feeder | None = None  # the device's thread of the iteration under way
        self._pinned_pool: PinnedPool | None = None  # its buffers, kept from epoch to epoch

    # --- the workers
    def _workers(self) -> WorkerPool | None:
        """The worker processes, started at the first iteration (before its reader thread:
        a fork copies no thread, and none of this loader's is then half-way through a read)."""
        if self.num_workers and self._pool is None:
            job = Job(self._make, self.dataset, tuple(self.columns))
            self._pool = WorkerPool(self.num_workers, job)
            weakref.finalize(self, self._pool.close)
        return self._pool

    def _pinned(self) -> PinnedPool:
        if self._pinned_pool is None:
            self._pinned_pool = PinnedPool()
        return self._pinned_pool

    @property
    def worker_pids(self) -> list[int]:
        """The process ids of the loader's workers (none before its first iteration)."""
        return self._pool.pids if self._pool is not None else []

    def close(self) -> None:
        """End the worker processes (the next iteration starts new ones)."""
        feeding, self._feeding = self._feeding, None
        if feeding is not None:
            feeding.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def __getstate__(self) -> dict[str, Any]:
        # processes and threads stay with the loader that made them
        return {**self.__dict__, "_pool": None, "_feeding": None, "_pinned_pool": None}

    def _check_lengths(self) -> None:
        for name in self.columns:
            column = self._by_name[name]
            lengths = column.lengths
            ragged = column.kind == ARRAY and lengths is not None and lengths[0] != lengths[1]
            if ragged and lengths is not None and name not in self.pad:
                raise ColumnError(
                    f"column {name!r} holds arrays of {lengths[0]} to {lengths[1]} values; "
                    f"a tensor needs one length: pass pad={{{name!r}: {lengths[1]}}} to pad "
                    "them with zeros, or make them one length first"
                )

    # --- the epoch and the position
    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch`; the epoch already under way (a resumed one) keeps its position,
        and one resumed at its end (a commit after its last batch, before the loop's epoch moved
        on) stays ended: its next iteration yields nothing, so no row is trained twice. An
        epoch this loader itself ran to its end starts again (a validation pass each epoch)."""
        if epoch != self.epoch or (not self._remaining and not self._ended):
            self.epoch = int(epoch)
            self._remaining = [(0, self._rows)]
            self._ended = False

    @property
    def consumed(self) -> int:
        """How many rows of this epoch the whole world has been given."""
        return self._rows - _order.total(self._remaining)

    def state_dict(self) -> dict[str, Any]:
        """The position, the same on every rank: rank 0's may be saved for all."""
        return {
            "version": _STATE_VERSION,
            "epoch": self.epoch,
            "remaining": [list(i) for i in self._remaining],
            "consumed": self.consumed,
            "rows": self._rows,
            "fingerprint": self.dataset.fingerprint,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "window_bytes": self._window_bytes,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at a saved position, in this world (of any size)."""
        mine = self.state_dict()
        differ = [
            k
            for k in ("version", "rows", "fingerprint", "seed", "shuffle", "window_bytes")
            if state.get(k) != mine[k]
        ]
        if differ:
            saved = {k: state.get(k) for k in differ}
            now = {k: mine[k] for k in differ}
            raise ValueError(
                f"this loader's state was saved with {saved}, but the loader has {now} "
                "(window_bytes follows prefetch): the epoch's order would differ; build the "
                "loader as it was, over the same data"
            )
        self.epoch = int(state["epoch"])
        self._remaining = _order.merged([(int(a), int(b)) for a, b in state["remaining"]])
        self._ended = not self._remaining  # saved after the epoch's last batch
        if self._follows_world:  # the state synced into a world re-formed in place
            here = environment.current()
            self.rank, self.size = here.rank or 0, here.size or 1

    # --- the batches
    def _plan(self) -> tuple[list[list[_order.Interval]], list[list[int]]]:
        shares = _order.split(self._remaining, self.size)
        counts = [_order.total(s) for s in shares]
        return shares, _order.batch_sizes(counts, self.batch_size, self.drop_last)

    def __len__(self) -> int:
        """The batches every rank yields from the current position (a full epoch if it ended,
        none if it was resumed at the end of the epoch set_epoch() names)."""
        if not self._remaining and self._ended:
            return 0
        if not self._remaining:
            shares = _order.split([(0, self._rows)], self.size)
            counts = [_order.total(s) for s in shares]
            return len(_order.batch_sizes(counts, self.batch_size, self.drop_last)[0])
        return len(self._plan()[1][0])

    def _start(
        self,
    ) -> tuple[list[list[_order.Interval]], list[list[int]], list[_order.Window]] | None:
        """An iteration's plan, fixed in the loop's thread before any batch is made: the shares,
        the ranks' batch sizes, the epoch's windows. None: nothing is left of this epoch (it
        was resumed at its end)."""
        if not self._remaining:
            if self._ended:
                self._ended = False
                return None
            self.epoch += 1  # a loop that never calls set_epoch(): the next epoch
            self._remaining = [(0, self._rows)]
        self._ended = False
        shares, sizes = self._plan()
        found = _order.windows(
            [p.rows for p in self.dataset.pieces],
            [p.bytes for p in self.dataset.pieces],
            shuffle=self.shuffle,
            seed=self.seed,
            epoch=self.epoch,
            window_bytes=self._window_bytes,
        )
        return shares, sizes, found

    def _made(
        self,
        shares: list[list[_order.Interval]],
        sizes: list[list[int]],
        found: list[_order.Window],
    ) -> Iterator[tuple[list[_order.Interval], dict[str, Any]]]:
        """This rank's batches of the plan, each with the positions no rank has been given once
        it is (the state it leaves), made in this thread from the reader's rows or by the
        workers from the plan alone."""
        pool = self._workers()
        budget = max(1, self.prefetch // 2)  # what the reader, or the units read ahead, hold
        if pool is not None:
            pieces = self.dataset.pieces
            plan = _plan.plan(
                found,
                shares[self.rank],
                sizes[self.rank],
                [p.rows for p in pieces],
                [p.bytes for p in pieces],
                (self.seed, self.epoch) if self.shuffle else None,
            )
            where = functools.partial(_row_groups, self.dataset, plan)
            made = pool.batches(
                plan, budget, where, functools.partial(_unit_groups, self.dataset, plan)
            )
            for step, arrays in enumerate(made):
                yield _order.left_after(shares, sizes, step + 1), arrays
            return
        reader = Reader(
            self.dataset,
            self.columns,
            found,
            shares[self.rank],
            shuffle=self.shuffle,
            seed=self.seed,
            epoch=self.epoch,
            budget=budget,
        )
        try:
            tables = batches_of(reader.tables(), sizes[self.rank])
            for step, table in enumerate(tables):
                yield _order.left_after(shares, sizes, step + 1), self._make(table)
        finally:
            reader.close()

    def numpy_batches(self) -> Iterator[dict[str, Any]]:
        """The batches as numpy arrays (or whatever `transform` returns): what `__iter__`
        and `tf_dataset` turn into tensors."""
        plan = self._start()
        if plan is None:
            return
        for left, arrays in self._made(*plan):
            self._remaining = left  # a batch counts as given once it is yielded
            yield arrays
        self._remaining = []  # the epoch is over (rows past drop_last's batches included)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # torch is imported here, not with hora.data (the driver's from_spark needs none), and
        # while the reader decodes the first window: at a rank's start both take seconds. Not
        # beside workers (they fork at the first batch, and a fork must not copy an import
        # half-way through in another thread) nor a device's thread.
        importing = threading.Thread(
            target=importlib.import_module, args=("torch",), name="hora-data-import-torch"
        )
        to_gpu = self.pin_memory or self.device is not None
        if self.num_workers or to_gpu:
            importing.run()
        else:
            importing.start()
        try:
            plan = self._start()
            made = self._made(*plan) if plan is not None else iter(())
            first = None if to_gpu else next(made, None)
        finally:
            if importing.is_alive():
                importing.join()
        import torch

        tensors = (
            (left, {name: _tensor(torch, value) for name, value in arrays.items()})
            for left, arrays in (made if first is None else itertools.chain([first], made))
        )
        fed = to_device(tensors, self.device, self.pin_memory, self._pinned) if to_gpu else tensors
        self._feeding = fed if isinstance(fed, Feeder) else None
        try:
            for left, batch in fed:
                self._remaining = left  # a batch counts as given once it is yielded
                yield batch
            if plan is not None:
                self._remaining = []  # the epoch is over
        finally:
            if isinstance(fed, Feeder):
                fed.close()
                self._feeding = None


def _row_groups(dataset: Files, plan: _plan.Plan, runs: Sequence[_plan.Run]) -> str:
    """The row groups a batch's rows come from, as an error names them."""
    rows = [p.rows for p in dataset.pieces]
    shuffled = plan.orders[runs[0][0]] is not None if runs else False
    return dataset.named(
        [p for r in runs for p in _plan.pieces_of(r, plan.windows, shuffled, rows)]
    )


def _unit_groups(dataset: Files, plan: _plan.Plan, unit: int) -> str:
    """The row groups of a unit, as an error names them."""
    return dataset.named(plan.units[unit].pieces)


def _tensor(torch: Any, value: Any) -> Any:
    """numpy arrays become tensors (copied only when read-only: Arrow's buffers are); the rest
    (tensors, lists of bytes a transform kept) pass as they are."""
    if isinstance(value, np.ndarray) and value.dtype != object:
        if not value.flags.writeable:
            value = value.copy()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(value)
    return value
