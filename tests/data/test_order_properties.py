"""The epoch's arithmetic under random worlds (hypothesis): whatever sizes a run goes through
and however many steps each world takes, every position of the epoch is given out exactly once
(or, with drop_last, at most once), ranks step in lockstep, and the state left is the same
positions whichever rank computes it."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from hora.data import _order


@settings(max_examples=300, deadline=None)
@given(
    rows=st.integers(1, 400),
    batch=st.integers(1, 40),
    worlds=st.lists(st.tuples(st.integers(1, 9), st.integers(0, 12)), min_size=1, max_size=5),
)
def test_resizes_give_every_position_once(rows, batch, worlds):
    remaining: list[_order.Interval] = [(0, rows)]
    given_out: list[int] = []
    for size, steps in [*worlds, (3, None)]:  # the last world finishes the epoch
        if _order.total(remaining) < size:
            size = max(1, _order.total(remaining))
        shares = _order.split(remaining, size)
        assert sorted(p for s in shares for a, b in s for p in range(a, b)) == [
            p for a, b in remaining for p in range(a, b)
        ]
        counts = [_order.total(s) for s in shares]
        assert max(counts) - min(counts) <= 1
        sizes = _order.batch_sizes(counts, batch, False)
        assert len({len(s) for s in sizes}) == 1  # lockstep
        assert [sum(s) for s in sizes] == counts  # every row of every share
        taken = len(sizes[0]) if steps is None else min(steps, len(sizes[0]))
        for share, own in zip(shares, sizes, strict=True):
            head = _order.take(share, sum(own[:taken]))[0]
            given_out += [p for a, b in head for p in range(a, b)]
        remaining = _order.left_after(shares, sizes, taken)
        if not remaining:
            break
    assert sorted(given_out) == list(range(rows))


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 400), batch=st.integers(1, 40), size=st.integers(1, 9))
def test_drop_last_gives_full_batches_at_most_once(rows, batch, size):
    shares = _order.split([(0, rows)], min(size, rows))
    sizes = _order.batch_sizes([_order.total(s) for s in shares], batch, True)
    assert all(b == batch for own in sizes for b in own)
    assert len({len(s) for s in sizes}) == 1
    given_out = list(
        itertools.chain.from_iterable(
            range(a, b)
            for share, own in zip(shares, sizes, strict=True)
            for a, b in _order.take(share, sum(own))[0]
        )
    )
    assert len(given_out) == len(set(given_out))


@settings(max_examples=100, deadline=None)
@given(
    pieces=st.lists(st.tuples(st.integers(1, 50), st.integers(1, 100)), min_size=1, max_size=30),
    seed=st.integers(0, 5),
    epoch=st.integers(0, 3),
    window=st.integers(1, 400),
)
def test_windows_cover_every_piece_once_in_order(pieces, seed, epoch, window):
    rows, sizes = zip(*pieces, strict=True)
    for shuffle in (False, True):
        found = _order.windows(
            rows, sizes, shuffle=shuffle, seed=seed, epoch=epoch, window_bytes=window
        )
        assert sorted(i for w in found for i in w.pieces) == list(range(len(pieces)))
        starts = list(itertools.accumulate((w.rows for w in found), initial=0))
        assert [w.start for w in found] == starts[:-1] and starts[-1] == sum(rows)
        if not shuffle:
            assert [i for w in found for i in w.pieces] == list(range(len(pieces)))
