"""What a rank's workers read and make, as arithmetic on the epoch's order: the units a worker
reads once for the rank's other workers (a shuffled window, or a run of row groups in file
order), and each batch of the rank as runs of rows of those units.

The rank decides everything here (the same positions as the reader's, so the same batches as
`num_workers=0`); the workers only read units and gather the runs a batch names.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from hora.data._order import Interval, Window

#: a batch's rows: (unit, first row, end row), rows counted in the unit's order
Run = tuple[int, int, int]


@dataclass(frozen=True)
class Unit:
    """Row groups one worker reads and shares with the rank's other workers; its rows hold
    positions [start, start + rows) of the epoch's order. `window` is the shuffled window
    whose permutation orders them (None: file order)."""

    start: int
    rows: int
    pieces: tuple[int, ...]
    window: int | None
    bytes: int


def units(
    found: Sequence[Window], piece_bytes: Sequence[int], *, shuffle: bool, window_bytes: int
) -> list[Unit]:
    """The epoch's units in order. Shuffled, a unit is a window (its permutation needs all its
    rows); in file order, consecutive row groups up to a quarter of a window (the first batch
    waits for one read, and a batch rarely needs more than one)."""
    if shuffle:
        return [
            Unit(w.start, w.rows, w.pieces, i, sum(piece_bytes[p] for p in w.pieces))
            for i, w in enumerate(found)
        ]
    limit = max(1, window_bytes // 4)
    made: list[Unit] = []
    start, rows, size = 0, 0, 0
    pieces: list[int] = []
    for w in found:
        more = sum(piece_bytes[p] for p in w.pieces)
        if pieces and size + more > limit:
            made.append(Unit(start, rows, tuple(pieces), None, size))
            start, rows, size, pieces = start + rows, 0, 0, []
        pieces += w.pieces
        rows += w.rows
        size += more
    if pieces:
        made.append(Unit(start, rows, tuple(pieces), None, size))
    return made


def runs(share: Sequence[Interval], sizes: Sequence[int], found: Sequence[Unit]) -> list[list[Run]]:
    """Each of the rank's batches (of `sizes` rows, from its `share` of positions) as runs of
    unit rows, in the batch's order."""
    starts = [u.start for u in found]
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
            _cut_into_units(position, end, starts, found, batch)
            left -= end - position
            position = end
        batches.append(batch)
    return batches


def _cut_into_units(
    a: int, b: int, starts: Sequence[int], found: Sequence[Unit], into: list[Run]
) -> None:
    while a < b:
        u = bisect.bisect_right(starts, a) - 1
        unit = found[u]
        end = min(b, unit.start + unit.rows)
        lo, hi = a - unit.start, end - unit.start
        if into and into[-1][0] == u and into[-1][2] == lo:
            into[-1] = (u, into[-1][1], hi)  # one run where two intervals meet
        else:
            into.append((u, lo, hi))
        a = end


def pieces_of(run: Run, found: Sequence[Unit], piece_rows: Sequence[int]) -> list[int]:
    """The row groups a run's rows come from: in file order the ones it spans, shuffled every
    row group of its window."""
    u, lo, hi = run
    unit = found[u]
    if unit.window is not None:
        return list(unit.pieces)
    named, first = [], 0
    for p in unit.pieces:
        if first < hi and lo < first + piece_rows[p]:
            named.append(p)
        first += piece_rows[p]
    return named
