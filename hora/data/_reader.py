"""A rank's reader: a background thread that decodes the windows holding the rank's positions and
hands over its rows in order, never holding more than a byte budget of decoded data ahead."""

from __future__ import annotations

import bisect
import collections
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hora.data._order import Interval, Window, window_permutation
from hora.data._rows import gather

if TYPE_CHECKING:
    from hora.data._files import Files

_END = object()
#: a shuffled window is handed over in parts of about this many bytes
PART_BYTES = 4 << 20
#: Parquet files a reader keeps open (a dataset of thousands of files would run out of them)
OPEN_FILES = 64


class Reader:
    """Rows of `intervals` (positions of the epoch's order), in order, as Arrow tables.

    The thread reads one window at a time (its pieces decoded and, when shuffled, permuted:
    about twice the window's bytes at the peak) and queues the slices the rank wants until
    `budget` bytes wait; then it waits for the loop to take some.
    """

    def __init__(
        self,
        dataset: Files,
        columns: Sequence[str],
        found: Sequence[Window],
        intervals: Sequence[Interval],
        *,
        shuffle: bool,
        seed: int,
        epoch: int,
        budget: int,
    ) -> None:
        self._dataset = dataset
        self._columns = list(columns)
        self._windows = found
        self._intervals = list(intervals)
        self._shuffle, self._seed, self._epoch = shuffle, seed, epoch
        self._budget = budget
        self._queue: collections.deque[Any] = collections.deque()
        self._held = 0
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="hora-data-reader", daemon=True)
        self._thread.start()

    # the loop's side
    def tables(self) -> Iterator[tuple[int, pa.Table]]:
        """The rows in order, as (the window they were read from, a table of them)."""
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                item, size = self._queue.popleft()
                self._held -= size
                self._cond.notify_all()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._queue.clear()
            self._held = 0
            self._cond.notify_all()
        self._thread.join()

    # the thread's side
    def _put(self, item: Any, size: int) -> bool:
        with self._cond:
            while self._held and self._held + size > self._budget and not self._stop:
                self._cond.wait()
            if self._stop:
                return False
            self._queue.append((item, size))
            self._held += size
            self._cond.notify_all()
            return True

    def _run(self) -> None:
        files: dict[int, Any] = {}
        starts = [w.start for w in self._windows]
        try:
            cached: tuple[int, pa.Table] | None = None
            for a, b in self._intervals:
                position = a
                while position < b:
                    w = bisect.bisect_right(starts, position) - 1
                    window = self._windows[w]
                    lo, hi = position - window.start, min(b, window.start + window.rows)
                    hi -= window.start
                    if cached is None or cached[0] != w:
                        cached = None  # let the last window go before the next is read
                        cached = (w, self._read(window, files))
                    for part in self._parts(w, cached[1], lo, hi):
                        if not self._put((w, part), part.get_total_buffer_size()):
                            return
                    position = window.start + hi
            self._put(_END, 0)
        except BaseException as e:  # raised in the loop
            self._put(e, 0)
        finally:
            for f in files.values():
                f.close()

    def _parts(self, w: int, rows: pa.Table, lo: int, hi: int) -> Iterator[pa.Table]:
        """Rows [lo, hi) of window `w`'s order: a slice in file order; shuffled, gathered a few
        MiB at a time, so that the first batch waits for the window's read, not its whole
        shuffled copy."""
        if not self._shuffle:
            yield rows.slice(lo, hi - lo)
            return
        order = window_permutation(w, rows.num_rows, seed=self._seed, epoch=self._epoch)
        step = max(1, rows.num_rows * PART_BYTES // max(1, rows.nbytes))
        for start in range(lo, hi, step):
            yield gather(rows, order[start : min(hi, start + step)])

    def _read(self, window: Window, files: dict[int, Any]) -> pa.Table:
        parts = [read_piece(self._dataset, i, self._columns, files) for i in window.pieces]
        return fixed_size(pa.concat_tables(parts) if len(parts) > 1 else parts[0])


def read_piece(
    dataset: Files, index: int, columns: Sequence[str], files: dict[int, Any]
) -> pa.Table:
    """Piece `index` of `dataset` (one row group) with `columns`, its `rows` live rows in file
    order; `files` keeps the last OPEN_FILES Parquet files opened, by file index (the caller
    closes them).

    Columns are read by the files' names (`dataset.renamed`) and handed over by the dataset's;
    rows a deletion vector removed (`piece.deleted`) are dropped here, the one place that reads."""
    piece = dataset.pieces[index]
    if piece.file in files:
        files[piece.file] = files.pop(piece.file)  # the most recent last
    else:
        if len(files) >= OPEN_FILES:
            files.pop(next(iter(files))).close()
        filesystem, root = dataset.location.arrow()
        name = dataset.files[piece.file]
        path = f"{root.rstrip('/')}/{name}" if name else root
        files[piece.file] = pq.ParquetFile(filesystem.open_input_file(path))
    names = [dataset.renamed.get(c, c) for c in columns]
    table = files[piece.file].read_row_group(piece.group, columns=list(dict.fromkeys(names)))
    if piece.deleted:
        table = table.filter(pa.array(piece.kept(table.num_rows)))
    if table.num_rows != piece.rows:
        raise ValueError(
            f"{dataset.uri}/{dataset.files[piece.file]}: row group {piece.group} holds "
            f"{table.num_rows} live rows where the dataset counted {piece.rows}: the file changed "
            "after the dataset was described; build the dataset again"
        )
    if dataset.renamed:
        table = pa.table([table.column(n) for n in names], names=list(columns))
    return table


def fixed_size(table: pa.Table) -> pa.Table:
    """Array columns whose arrays all have one length, as fixed-size lists: Arrow's `take`
    (the window's shuffle) gathers those rows as blocks, several times faster than lists."""
    for index, field in enumerate(table.schema):
        if not (pa.types.is_list(field.type) or pa.types.is_large_list(field.type)):
            continue
        column = table.column(index).combine_chunks()
        if column.null_count or not len(column):
            continue  # the batch's conversion names the nulls
        lengths = pc.min_max(pc.list_value_length(column))
        shortest, longest = lengths["min"].as_py(), lengths["max"].as_py()
        if shortest != longest or not longest:
            continue  # ragged (padded later), or empty arrays
        fixed = column.cast(pa.list_(field.type.value_type, longest))
        table = table.set_column(index, field.name, fixed)
    return table
