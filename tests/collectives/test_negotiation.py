"""The coordinator's logic on its own (no processes): matching by name, validation, fusion plan."""

from __future__ import annotations

import math

from hora.collectives._common import Max, Sum
from hora.collectives._control.negotiation import Coordinator
from hora.collectives._messages import (
    ALLGATHER,
    ALLREDUCE,
    BROADCAST,
    Bucket,
    Failure,
    JoinDone,
    Request,
)


def req(name: str, kind: str = ALLREDUCE, shape=(4,), dtype="float32", **kw) -> Request:
    nbytes = 4 * math.prod(shape)
    return Request(name, kind, 0, (dtype,), (tuple(shape),), "cpu", nbytes, **kw)


def test_matches_by_name_whatever_the_order() -> None:
    c = Coordinator(2, 1 << 20)
    c.submit(0, req("a"))
    c.submit(0, req("b"))
    assert c.take() == []
    c.submit(1, req("b"))
    c.submit(1, req("a"))
    (bucket,) = c.take()
    assert isinstance(bucket, Bucket)
    assert [e.name for e in bucket.entries] == ["b", "a"]  # the order they became ready


def test_threshold_cuts_buckets_and_signatures_split_them() -> None:
    c = Coordinator(1, 40)
    for k in range(5):
        c.submit(0, req(f"t{k}", shape=(4,)))  # 16 bytes each
    c.submit(0, req("max", op=Max))
    c.submit(0, req("g", kind=ALLGATHER))
    buckets = c.take()
    assert [[e.name for e in b.entries] for b in buckets] == [
        ["t0", "t1"],
        ["t2", "t3"],
        ["t4"],
        ["max"],
        ["g"],
    ]


def test_zero_threshold_disables_fusion() -> None:
    c = Coordinator(1, 0)
    for k in range(3):
        c.submit(0, req(f"t{k}"))
    assert [len(b.entries) for b in c.take()] == [1, 1, 1]


def test_mismatches_become_failures() -> None:
    c = Coordinator(2, 1 << 20)
    c.submit(0, req("s", shape=(2,)))
    c.submit(1, req("s", shape=(3,)))
    c.submit(0, req("r", kind=BROADCAST, root=0))
    c.submit(1, req("r", kind=BROADCAST, root=1))
    c.submit(0, req("o", op=Sum))
    c.submit(1, req("o", op=Max))
    failures = c.take()
    assert [type(f) for f in failures] == [Failure] * 3
    assert "shapes" in failures[0].message and "rank 1 has [3]" in failures[0].message
    assert "root" in failures[1].message
    assert "ops" in failures[2].message


def test_join_lets_the_others_proceed_and_reports_the_last_rank() -> None:
    c = Coordinator(3, 1 << 20)
    c.join(0)
    c.submit(1, req("x"))
    assert c.take() == []
    c.submit(2, req("x"))
    (bucket,) = c.take()
    assert bucket.entries[0].name == "x"
    c.join(2)
    c.join(1)
    assert c.take() == [JoinDone(1)]
