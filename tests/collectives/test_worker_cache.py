"""A worker's half of the response cache on its own (no processes): what it sends as ids, what
it learns from rank 0's buckets, and what a CacheDrop makes it forget."""

from __future__ import annotations

import math

from hora.collectives._control import channel as _channel
from hora.collectives._control.cache import WorkerCache
from hora.collectives._control.negotiation import Coordinator
from hora.collectives._messages import ALLGATHER, ALLREDUCE, JOIN, Bucket, CacheDrop, Entry, Request


def req(name: str, shape=(4,), kind: str = ALLREDUCE) -> Request:
    return Request(name, kind, 0, ("float32",), (tuple(shape),), "cpu", 4 * math.prod(shape))


def announcing(cache_id: int, request: Request) -> Bucket:
    """A bucket as rank 0 sends it the first time every rank agreed on `request`."""
    return Bucket(request.kind, 0, [Entry(request.name, {0: request}, cache_id)])


def test_a_request_travels_as_its_id_once_announced() -> None:
    cache = WorkerCache()
    assert cache.encode([req("a"), JOIN]) == [req("a"), JOIN]  # nothing known yet
    cache.learn(announcing(5, req("a")), (0, 1))
    sent = cache.encode([req("a"), req("b"), JOIN])
    assert sent == [5, req("b"), JOIN]
    assert cache.encode([req("a", shape=(5,))]) == [req("a", shape=(5,))]  # changed: in full


def test_a_hit_expands_to_one_entry_per_id_for_every_member_where_sizes_differ() -> None:
    cache = WorkerCache()
    cache.learn(announcing(3, req("r")), (0, 1, 2))
    cache.learn(announcing(4, req("g", kind=ALLGATHER)), (0, 1, 2))
    # as unpickled: hits travel as bare ids
    received = [Bucket(ALLREDUCE, 0, [3]), Bucket(ALLGATHER, 0, [4])]  # type: ignore[list-item]
    for bucket in received:
        cache.learn(bucket, (0, 1, 2))
    (reduce_entry,), (gather_entry,) = (b.entries for b in received)
    assert reduce_entry.requests == {0: req("r")} and reduce_entry.cached == 3
    assert gather_entry.requests == dict.fromkeys((0, 1, 2), req("g", kind=ALLGATHER))
    again = Bucket(ALLREDUCE, 0, [3])  # type: ignore[list-item]
    cache.learn(again, (0, 1, 2))
    assert again.entries[0] is reduce_entry  # built once per id


def test_a_drop_makes_it_send_the_request_again_and_is_counted() -> None:
    cache = WorkerCache()
    cache.learn(announcing(0, req("a")), (0, 1))
    cache.learn(Bucket(ALLREDUCE, 0, [0]), (0, 1))  # type: ignore[list-item]
    cache.forget(CacheDrop((0,)))
    assert cache.drops_applied == 1
    assert cache.encode([req("a")]) == [req("a")]
    assert cache.ids == {} and cache.requests == {}


def test_a_name_cached_anew_survives_the_drop_of_its_old_id() -> None:
    cache = WorkerCache()
    cache.learn(announcing(0, req("a")), (0, 1))
    cache.learn(announcing(1, req("a", shape=(5,))), (0, 1))  # rank 0 replaced it ...
    cache.forget(CacheDrop((0,)))  # ... and drops the old id after the new bucket
    assert cache.encode([req("a", shape=(5,))]) == [1]


def test_rounds_against_a_real_coordinator_over_the_wire_format() -> None:
    """Rank 0 (a Coordinator) and a worker's cache agree round after round, through pickles."""
    coord = Coordinator(2, 1 << 20, cache_capacity=2)
    worker = WorkerCache()
    names = ["a", "b", "c"]
    for step in range(4):
        for name in names[: 2 + step % 2]:  # "c" comes and goes: evictions at capacity 2
            drops, items = _channel.loads(
                _channel.pack((worker.drops_applied, worker.encode([req(name)])))
            )
            for item in items:
                if type(item) is int:
                    coord.submit_cached(1, item)
                else:
                    coord.submit(1, item)
            coord.cache.ack((1,), drops)
            coord.submit(0, req(name))
        for resp in _channel.loads(_channel.pack(coord.take())):
            if type(resp) is Bucket:
                worker.learn(resp, (0, 1))
                assert [e.ref for e in resp.entries] == [req(e.name) for e in resp.entries]
            elif type(resp) is CacheDrop:
                worker.forget(resp)
    known = {key: cid for key, (cid, _) in worker.ids.items()}
    assert known == coord.cache.ids()
    assert coord.cached_submissions > 0 and worker.drops_applied > 0
