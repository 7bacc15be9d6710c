"""A rank's loader: its share of each epoch's order, in batches of torch tensors, resumable.

Ranks step in lockstep (every rank yields the same number of batches), so after k batches every
rank knows what the whole world has consumed. `state_dict()` is that: the epoch and the
positions of its order no rank has consumed, the same on every rank. `load_state_dict()` in a
world of any size splits those positions again: an elastic resize trains each row once per
epoch, and a restart resumes exactly where the commit was made.
"""

from __future__ import annotations

import importlib
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from hora import environment
from hora.data import _order
from hora.data._columns import ARRAY, ColumnError, check_selected, to_numpy
from hora.data._reader import Reader

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
        transform: Callable[[dict[str, Any]], Mapping[str, Any]] | None = None,
        prefetch: int = DEFAULT_PREFETCH,
        pad: Mapping[str, int] | None = None,
        rank: int | None = None,
        size: int | None = None,
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
        self._rows = dataset.rows
        self._window_bytes = max(1, prefetch // 4)
        self.epoch = 0
        self._remaining: list[_order.Interval] = [(0, self._rows)]

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
        """Start epoch `epoch`; the epoch already under way (a resumed one) keeps its position."""
        if epoch != self.epoch or not self._remaining:
            self.epoch = int(epoch)
            self._remaining = [(0, self._rows)]

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
        if self._follows_world:  # the state synced into a world re-formed in place
            here = environment.current()
            self.rank, self.size = here.rank or 0, here.size or 1

    # --- the batches
    def _plan(self) -> tuple[list[list[_order.Interval]], list[list[int]]]:
        shares = _order.split(self._remaining, self.size)
        counts = [_order.total(s) for s in shares]
        return shares, _order.batch_sizes(counts, self.batch_size, self.drop_last)

    def __len__(self) -> int:
        """The batches every rank yields from the current position (a full epoch if it ended)."""
        if not self._remaining:
            shares = _order.split([(0, self._rows)], self.size)
            counts = [_order.total(s) for s in shares]
            return len(_order.batch_sizes(counts, self.batch_size, self.drop_last)[0])
        return len(self._plan()[1][0])

    def numpy_batches(self) -> Iterator[dict[str, Any]]:
        """The batches as numpy arrays (or whatever `transform` returns): what `__iter__`
        and `tf_dataset` turn into tensors."""
        if not self._remaining:
            self.epoch += 1
            self._remaining = [(0, self._rows)]
        shares, sizes = self._plan()
        found = _order.windows(
            [p.rows for p in self.dataset.pieces],
            [p.bytes for p in self.dataset.pieces],
            shuffle=self.shuffle,
            seed=self.seed,
            epoch=self.epoch,
            window_bytes=self._window_bytes,
        )
        reader = Reader(
            self.dataset,
            self.columns,
            found,
            shares[self.rank],
            shuffle=self.shuffle,
            seed=self.seed,
            epoch=self.epoch,
            budget=max(1, self.prefetch // 2),
        )
        try:
            tables = reader.tables()
            pending: list[pa.Table] = []
            held = 0
            for step, size in enumerate(sizes[self.rank]):
                while held < size:
                    table = next(tables)
                    pending.append(table)
                    held += table.num_rows
                batch, pending, held = _cut(pending, size, held)
                arrays = to_numpy(batch, self._by_name, self.pad)
                if self.transform is not None:
                    arrays = dict(self.transform(arrays))
                self._remaining = _order.left_after(shares, sizes, step + 1)
                yield arrays
            self._remaining = []  # the epoch is over (rows past drop_last's batches included)
        finally:
            reader.close()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # torch is imported here, not with hora.data (the driver's from_spark needs none), and
        # while the reader decodes the first window: at a rank's start both take seconds.
        importing = threading.Thread(
            target=importlib.import_module, args=("torch",), name="hora-data-import-torch"
        )
        importing.start()
        batches = self.numpy_batches()
        try:
            first = next(batches, None)
        finally:
            importing.join()
        import torch

        if first is None:
            return
        yield {name: _tensor(torch, value) for name, value in first.items()}
        for arrays in batches:
            yield {name: _tensor(torch, value) for name, value in arrays.items()}


def _cut(pending: list[pa.Table], size: int, held: int) -> tuple[pa.Table, list[pa.Table], int]:
    """The first `size` rows of the pending tables as one table, and what is left."""
    whole = pa.concat_tables(pending) if len(pending) > 1 else pending[0]
    batch = whole.slice(0, size).combine_chunks()
    rest = whole.slice(size)
    return batch, ([rest] if rest.num_rows else []), held - size


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
