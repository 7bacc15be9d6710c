"""What a rank's workers read and make, as arithmetic on the epoch's order: the units a worker
reads once for the rank's other workers, and each batch of the rank as runs of rows of the
epoch's windows.

The windows' row groups, one window after the other, are the epoch's *read order*: a window's
rows are rows [start, start + rows) of it, before its permutation. A unit is a run of row
groups of the read order, of at most `unit_bytes`: the first window of an epoch is read by
several workers at once, and a unit's read is one task among a worker's batches. The rank
decides everything here (the positions the reader would give, so the same batches as
`num_workers=0`); the workers read units and gather the runs a batch names.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from hora.data._order import Interval, Window

#: a batch's rows: (window, first row, end row), rows counted in the window's order
Run = tuple[int, int, int]
#: how a window's rows are ordered: (seed, epoch, window) of a shuffled one, None: file order
Order = tuple[int, int, int] | None
#: the most bytes of row groups one read reads (a row group larger is one unit by itself)
UNIT_BYTES = 8 << 20


@dataclass(frozen=True)
class Unit:
    """Row groups one worker reads and shares with the rank's other workers: rows
    [start, start + rows) of the read order."""

    start: int
    rows: int
    pieces: tuple[int, ...]
    bytes: int


def units(
    found: Sequence[Window],
    piece_rows: Sequence[int],
    piece_bytes: Sequence[int],
    unit_bytes: int,
) -> list[Unit]:
    """The epoch's units in read order: consecutive row groups up to `unit_bytes`."""
    made: list[Unit] = []
    start, rows, size = 0, 0, 0
    pieces: list[int] = []
    for p in (p for w in found for p in w.pieces):
        if pieces and size + piece_bytes[p] > unit_bytes:
            made.append(Unit(start, rows, tuple(pieces), size))
            start, rows, size, pieces = start + rows, 0, 0, []
        pieces.append(p)
        rows += piece_rows[p]
        size += piece_bytes[p]
    if pieces:
        made.append(Unit(start, rows, tuple(pieces), size))
    return made


@dataclass(frozen=True)
class Plan:
    """A rank's iteration as its workers make it: its batches as runs of window rows, the
    epoch's windows and how each is ordered, the units and which of them hold each window."""

    batches: list[list[Run]]
    windows: Sequence[Window]
    orders: list[Order]
    units: list[Unit]
    covering: list[range]

    def windows_of(self, step: int) -> list[int]:
        return list(dict.fromkeys(w for w, _, _ in self.batches[step]))

    def units_of(self, step: int) -> list[int]:
        return list(dict.fromkeys(u for w in self.windows_of(step) for u in self.covering[w]))


def plan(
    found: Sequence[Window],
    share: Sequence[Interval],
    sizes: Sequence[int],
    piece_rows: Sequence[int],
    piece_bytes: Sequence[int],
    order: tuple[int, int] | None,
) -> Plan:
    """The plan of a rank's `share` in `sizes` batches; `order` is (seed, epoch) when the
    windows are shuffled."""
    made = units(found, piece_rows, piece_bytes, UNIT_BYTES)
    starts = [u.start for u in made]
    covering = [
        range(
            bisect.bisect_right(starts, w.start) - 1,
            bisect.bisect_right(starts, w.start + w.rows - 1),
        )
        for w in found
    ]
    orders: list[Order] = [None if order is None else (*order, w) for w in range(len(found))]
    return Plan(runs(share, sizes, found), found, orders, made, covering)


def runs(
    share: Sequence[Interval], sizes: Sequence[int], found: Sequence[Window]
) -> list[list[Run]]:
    """Each of the rank's batches (of `sizes` rows, from its `share` of positions) as runs of
    window rows, in the batch's order."""
    starts = [w.start for w in found]
    batches: list[list[Run]] = []
    interval, position = 0, share[0][0] if share else 0
    for size in sizes:
        batch: list[Run] = []
        left = size
        while left:
            while position >= share[interval][1]:
                interval += 1
                position = share[interval][0]
            end = min(share[interval][1], position + left)
            _cut_into_windows(position, end, starts, found, batch)
            left -= end - position
            position = end
        batches.append(batch)
    return batches


def _cut_into_windows(
    a: int, b: int, starts: Sequence[int], found: Sequence[Window], into: list[Run]
) -> None:
    while a < b:
        w = bisect.bisect_right(starts, a) - 1
        window = found[w]
        end = min(b, window.start + window.rows)
        lo, hi = a - window.start, end - window.start
        if into and into[-1][0] == w and into[-1][2] == lo:
            into[-1] = (w, into[-1][1], hi)  # one run where two intervals meet
        else:
            into.append((w, lo, hi))
        a = end


def pieces_of(
    run: Run, found: Sequence[Window], shuffle: bool, piece_rows: Sequence[int]
) -> list[int]:
    """The row groups a run's rows come from: shuffled every row group of its window, in file
    order the ones it spans."""
    w, lo, hi = run
    if shuffle:
        return list(found[w].pieces)
    named, first = [], 0
    for p in found[w].pieces:
        if first < hi and lo < first + piece_rows[p]:
            named.append(p)
        first += piece_rows[p]
    return named
