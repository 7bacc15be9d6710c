"""The epoch's global order and who reads which part of it: pure arithmetic, the same on every rank.

The order of an epoch is a function of (seed, epoch): the row groups ("pieces") are shuffled,
cut into windows of at most `window_bytes`, and the rows of each window are shuffled. A world
splits what is left of that order (a list of [start, end) intervals of positions) into one
contiguous share per rank; each rank cuts its share into the same number of batches, so ranks
step in lockstep. What every rank has consumed after k batches is known to all of them, so the
positions left over are the same on every rank: that is the state a commit keeps, and a world of
another size splits it again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Interval = tuple[int, int]


@dataclass(frozen=True)
class Window:
    """A run of pieces read and shuffled together; its rows hold positions [start, start+rows)."""

    start: int
    rows: int
    pieces: tuple[int, ...]


def windows(
    piece_rows: Sequence[int],
    piece_bytes: Sequence[int],
    *,
    shuffle: bool,
    seed: int,
    epoch: int,
    window_bytes: int,
) -> list[Window]:
    """The epoch's windows in order. Without shuffle each piece is its own window, in file order."""
    order = list(range(len(piece_rows)))
    if shuffle:
        order = [int(i) for i in np.random.default_rng([seed, epoch]).permutation(len(order))]
    found: list[Window] = []
    group: list[int] = []
    size = 0
    start = 0

    def close() -> None:
        nonlocal group, size, start
        rows = sum(piece_rows[i] for i in group)
        found.append(Window(start, rows, tuple(group)))
        start += rows
        group, size = [], 0

    for i in order:
        if group and (not shuffle or size + piece_bytes[i] > window_bytes):
            close()
        group.append(i)
        size += piece_bytes[i]
    if group:
        close()
    return found


def window_permutation(window: int, rows: int, *, seed: int, epoch: int) -> np.ndarray:
    """The shuffled order of a window's rows (indexes into the window's concatenated pieces)."""
    return np.random.default_rng([seed, epoch, window + 1]).permutation(rows)


def total(intervals: Sequence[Interval]) -> int:
    return sum(b - a for a, b in intervals)


def take(intervals: Sequence[Interval], count: int) -> tuple[list[Interval], list[Interval]]:
    """The first `count` positions of `intervals`, and the rest."""
    head: list[Interval] = []
    rest: list[Interval] = []
    for a, b in intervals:
        if count >= b - a:
            head.append((a, b))
            count -= b - a
        elif count > 0:
            head.append((a, a + count))
            rest.append((a + count, b))
            count = 0
        else:
            rest.append((a, b))
    return head, rest


def split(remaining: Sequence[Interval], world: int) -> list[list[Interval]]:
    """One contiguous share of `remaining` per rank, as even as can be (the first ranks +1)."""
    left = list(remaining)
    n = total(left)
    shares = []
    for r in range(world):
        share, left = take(left, n // world + (1 if r < n % world else 0))
        shares.append(share)
    return shares


def batch_sizes(shares: Sequence[int], batch_size: int, drop_last: bool) -> list[list[int]]:
    """Each rank's batch sizes: the same number of batches on every rank (lockstep).

    With drop_last every batch is full and the rows past the smallest share's last full batch
    are left out of the epoch. Without it every row is given out: a rank's last batches may be
    smaller; where the smaller shares would run out of rows before the last batch (batch_size
    1, shares of a row or two) there is one batch fewer and a rank's last one holds up to
    batch_size + 1 rows. Only a rank with no rows at all gets an empty batch.
    """
    if drop_last:
        n = min(shares) // batch_size
        return [[batch_size] * n for _ in shares]
    n = math.ceil(max(shares) / batch_size) if shares else 0
    if 0 < min(shares, default=0) < n:
        n = math.ceil(min(shares) / batch_size)
        return [[batch_size] * (n - 1) + [s - batch_size * (n - 1)] for s in shares]
    found = []
    for s in shares:
        sizes, taken = [], 0
        for i in range(n):
            size = max(0, min(batch_size, s - taken - (n - 1 - i)))
            size = min(size, s - taken)
            sizes.append(size)
            taken += size
        found.append(sizes)
    return found


def left_after(
    shares: Sequence[Sequence[Interval]], sizes: Sequence[Sequence[int]], steps: int
) -> list[Interval]:
    """The positions no rank has consumed after `steps` batches each, in rank order."""
    rest: list[Interval] = []
    for share, own in zip(shares, sizes, strict=True):
        rest += take(share, sum(own[:steps]))[1]
    return merged(rest)


def merged(intervals: Sequence[Interval]) -> list[Interval]:
    """Adjacent intervals joined (keeps a committed state short)."""
    out: list[Interval] = []
    for a, b in intervals:
        if b <= a:
            continue
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out
