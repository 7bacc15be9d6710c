"""The response cache: agreed requests travel as ids; mismatches still fail on every rank."""

from __future__ import annotations

import math
import os
import time

import pytest

import hora
from hora.collectives._control.negotiation import Coordinator
from hora.collectives._messages import ALLREDUCE, Bucket, CacheDrop, Failure, Request


def req(name: str, shape=(4,), **kw) -> Request:
    return Request(
        name, ALLREDUCE, 0, ("float32",), (tuple(shape),), "cpu", 4 * math.prod(shape), **kw
    )


def test_agreed_request_gets_an_id_and_a_hit_announces_nothing() -> None:
    c = Coordinator(2, 1 << 20, cache_capacity=8)
    c.submit(0, req("a"))
    c.submit(1, req("a"))
    (bucket,) = c.take()
    cid = bucket.entries[0].cache_id
    assert cid >= 0 and c.cache.ids() == {(0, "a"): cid}
    c.submit(0, req("a"))
    c.submit_cached(1, cid)  # rank 1 sends only the id
    (bucket,) = c.take()
    assert isinstance(bucket, Bucket) and bucket.entries[0].cache_id == -1
    assert bucket.entries[0].ref == req("a") and c.cached_submissions == 1


def test_generated_names_and_disabled_cache_are_not_cached() -> None:
    c = Coordinator(1, 1 << 20, cache_capacity=8)
    c.submit(0, req("allreduce.noname.3"))
    assert c.take()[0].entries[0].cache_id == -1
    off = Coordinator(1, 1 << 20, cache_capacity=0)
    off.submit(0, req("a"))
    assert off.take()[0].entries[0].cache_id == -1 and off.cache.ids() == {}


def test_mismatch_against_a_cached_id_fails_and_drops_the_entry() -> None:
    c = Coordinator(2, 1 << 20, cache_capacity=8)
    c.submit(0, req("a"))
    c.submit(1, req("a"))
    cid = c.take()[0].entries[0].cache_id
    c.submit_cached(1, cid)
    c.submit(0, req("a", shape=(5,)))
    failure, drop = c.take()
    assert isinstance(failure, Failure) and "shapes" in failure.message
    assert drop == CacheDrop((cid,)) and c.cache.ids() == {}
    # rank 1 may still send the dropped id until it has applied the drop: it still resolves
    c.submit_cached(1, cid)
    c.cache.ack((1,), 0)
    assert c.cache.resolve(cid) == req("a")
    c.cache.ack((1,), 1)  # rank 1 has applied the drop: the id is gone for good
    with pytest.raises(RuntimeError, match="unknown response-cache id"):
        c.cache.resolve(cid)


def test_capacity_evicts_the_least_recently_used() -> None:
    c = Coordinator(2, 1 << 20, cache_capacity=2)
    ids = {}
    for name in ("a", "b"):
        c.submit(0, req(name))
        c.submit(1, req(name))
        ids[name] = c.take()[0].entries[0].cache_id
    c.submit(0, req("a"))  # a hit makes "a" the most recent
    c.submit_cached(1, ids["a"])
    c.take()
    c.submit(0, req("c"))
    c.submit(1, req("c"))
    bucket, drop = c.take()
    assert drop == CacheDrop((ids["b"],))
    assert c.cache.ids() == {(0, "a"): ids["a"], (0, "c"): bucket.entries[0].cache_id}


def _cached(c: Coordinator, names: list[str]) -> list[int]:
    """Agree on `names` once (both ranks of a world of two); their cache ids, in order."""
    for name in names:
        c.submit(0, req(name))
        c.submit(1, req(name))
    return [e.cache_id for b in c.take() if isinstance(b, Bucket) for e in b.entries]


def test_a_repeated_round_is_answered_from_its_plan() -> None:
    c = Coordinator(2, 1 << 20, cache_capacity=8)
    ids = tuple(_cached(c, ["a", "b", "c"]))
    for _ in range(2):
        own = c.cache.own_ids([req("a"), req("b"), req("c")])
        assert own == ids
        c.receive_ids(0, own, now=0.0)
        assert c.take() == []  # rank 1's ids are still to come
        assert c.stash_age(0.5) == 0.5 and not c.has_pending()  # counted, not pending
        c.receive_ids(1, ids, now=0.0)
        (bucket,) = c.take()
        assert [e.name for e in bucket.entries] == ["a", "b", "c"]
        assert [e.cached for e in bucket.entries] == list(ids)  # they travel as ids
        assert c.stash_age(1.0) is None
    assert c.repeated_rounds == 2 and c.cached_submissions == 6
    assert c.cache.own_ids([req("a"), req("b", shape=(5,))]) is None  # not the cached request


def test_ids_agree_in_any_order_and_frames_and_run_in_the_order_they_became_ready() -> None:
    c = Coordinator(3, 1 << 20, cache_capacity=8)
    a, b, d = _cached3(c, ["a", "b", "d"])
    c.receive_ids(0, (a, b, d), now=0.0)
    c.receive_ids(1, (d,), now=0.0)  # rank 1's round in two frames, in another order
    c.receive_ids(2, (b, d, a), now=0.0)
    c.receive_ids(1, (b, a), now=0.0)
    (bucket,) = c.take()
    assert [e.name for e in bucket.entries] == ["d", "b", "a"] and c.repeated_rounds == 1


def _cached3(c: Coordinator, names: list[str]) -> list[int]:
    for name in names:
        for rank in range(3):
            c.submit(rank, req(name))
    return [e.cache_id for b in c.take() if isinstance(b, Bucket) for e in b.entries]


def test_an_id_also_sent_by_name_is_matched_by_name_with_its_ranks_so_far() -> None:
    c = Coordinator(2, 1 << 20, cache_capacity=8)
    (a,) = _cached(c, ["a"])
    c.receive_ids(1, (a,), now=1.0)  # counted ...
    c.submit(0, req("new"))  # ... an unrelated request leaves it counted
    assert c.has_set_aside() and set(c.pending) == {(0, "new")}
    c.submit(0, req("a", shape=(5,)))  # rank 0 sends "a" by name (changed): rank 1's joins it
    (failure, drop) = c.take()
    assert isinstance(failure, Failure) and "shapes" in failure.message
    assert drop == CacheDrop((a,)) and not c.has_set_aside()


def test_a_round_left_waiting_is_spilled_where_the_stall_inspector_sees_it() -> None:
    c = Coordinator(2, 1 << 20, cache_capacity=8)
    (a,) = _cached(c, ["a"])
    c.receive_ids(1, (a,), now=10.0)
    assert c.stash_age(10.5) == 0.5 and c.pending == {}
    c.spill()
    assert c.pending == {(0, "a"): {1: req("a")}} and c.stash_age(11.0) is None
    c.receive_ids(0, (a,), now=11.0)  # the late rank's id: matched by name with the others'
    (bucket,) = c.take()
    assert [e.name for e in bucket.entries] == ["a"] and not c.pending


def test_an_id_evicted_while_counted_travels_in_full() -> None:
    c = Coordinator(2, 1 << 20, cache_capacity=1)
    (a,) = _cached(c, ["a"])
    c.receive_ids(0, (a,), now=0.0)  # counted ...
    (_, drop) = _cached_responses(c, "b")  # ... "b" evicts "a" meanwhile
    assert drop == CacheDrop((a,))
    c.receive_ids(1, (a,), now=0.0)  # rank 1 chose the id before it saw the drop
    (bucket,) = c.take()
    (entry,) = bucket.entries
    assert entry.name == "a" and entry.cached == -1  # in full: the ranks forgot the id
    assert Bucket.__reduce__(bucket)[1][2] == [entry]


def _cached_responses(c: Coordinator, name: str) -> list:
    for rank in (0, 1):
        c.submit(rank, req(name))
    return c.take()


def test_a_dropped_id_is_planned_one_by_one() -> None:
    c = Coordinator(2, 1 << 20, cache_capacity=1)
    (a,) = _cached(c, ["a"])
    c.receive_ids(0, (a,), now=0.0)
    c.receive_ids(1, (a,), now=0.0)
    c.take()  # planned and remembered
    _cached(c, ["b"])  # evicts "a": its plan is forgotten with it
    c.receive_ids(0, (a,), now=0.0)  # not a live id: matched by name at once
    assert c.pending == {(0, "a"): {0: req("a")}}
    c.receive_ids(1, (a,), now=0.0)  # rank 1 had not applied the drop yet: the id resolves
    bucket, *_ = c.take()  # "a" matched again in full, and cached anew
    assert isinstance(bucket, Bucket) and [e.name for e in bucket.entries] == ["a"]
    assert bucket.entries[0].cache_id >= 0 and c.repeated_rounds == 1


def _ranks_job() -> dict[str, object]:
    """Runs on every rank: hits, a mismatch on the last rank only, eviction at capacity 3."""
    os.environ["HOROVOD_CACHE_CAPACITY"] = "3"
    import torch

    import hora.torch as hvd
    from hora.collectives._control import state as _state

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    out: dict[str, object] = {}
    for _ in range(3):  # the 2nd and 3rd rounds travel as ids from the workers
        x = hvd.allreduce(torch.full((4,), float(r + 1)), op=hvd.Sum, name="a")
        assert torch.equal(x, torch.full((4,), n * (n + 1) / 2))
    shape = (5,) if r == n - 1 else (4,)
    try:
        hvd.allreduce(torch.ones(shape), op=hvd.Sum, name="a")
        out["mismatch"] = "no error"
    except hvd.HorovodInternalError as exc:
        out["mismatch"] = str(exc)
    x = hvd.allreduce(torch.ones(4), op=hvd.Sum, name="a")  # checked in full again, then fine
    assert torch.equal(x, torch.full((4,), float(n)))
    for _ in range(3):  # 6 names through a cache of 3: evictions
        handles = [
            hvd.allreduce_async(torch.ones(k + 1), op=hvd.Sum, name=f"e{k}") for k in range(6)
        ]
        for k, h in enumerate(handles):
            assert torch.equal(hvd.synchronize(h), torch.full((k + 1,), float(n)))
    negotiation = _state.get().loop.negotiation
    coord = negotiation.coordinator if r == 0 else None  # type: ignore[union-attr]
    hvd.shutdown()  # every response, CacheDrops included, has been applied on every rank
    if coord is not None:
        out["cache"] = {name: cid for (_, name), cid in coord.cache.ids().items()}
        out["cached_submissions"] = coord.cached_submissions
    else:
        cache = negotiation.cache
        out["cache"] = {name: cid for (_, name), (cid, _) in cache.ids.items()}
        assert {cid: sig.name for cid, sig in cache.ids.values()} == {
            cid: sig.name for cid, sig in cache.requests.items()
        }
    return out


@pytest.mark.parametrize("np", [2, 3])
def test_cache_across_ranks(np: int) -> None:
    results = hora.run(_ranks_job, np=np)
    for r, res in enumerate(results):
        assert "Mismatched allreduce tensor shapes" in res["mismatch"], (r, res["mismatch"])
    caches = [res["cache"] for res in results]
    assert len(caches[0]) == 3 and all(c == caches[0] for c in caches), caches
    assert set(caches[0]) <= {f"allreduce.e{k}" for k in range(6)}
    # workers sent ids for the repeated "a" rounds and the repeated "e*" batches that hit
    assert results[0]["cached_submissions"] >= 2 * (np - 1)


def _repeated_rounds_job() -> dict[str, object]:
    """Runs on every rank: steps of the same grouped and single allreduces (repeated rounds),
    then steps whose order differs per rank, then a round that one rank never completes."""
    os.environ["HOROVOD_STALL_CHECK_TIME_SECONDS"] = "1"
    os.environ["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] = "2"
    import torch

    import hora.torch as hvd
    from hora.collectives._control import state as _state

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    names = [f"g{k}" for k in range(8)]
    for step in range(6):
        ts = [torch.full((k + 1,), float(r + step)) for k in range(8)]
        handles = [
            hvd.allreduce_async_(t, op=hvd.Sum, name=nm) for t, nm in zip(ts, names, strict=True)
        ]
        for k, h in enumerate(handles):
            want = sum(float(q + step) for q in range(n))
            assert torch.equal(hvd.synchronize(h), torch.full((k + 1,), want)), (step, k)
    for _ in range(3):  # the same names, in another order on the last rank
        order = names[::-1] if r == n - 1 else names
        handles = {nm: hvd.allreduce_async(torch.ones(4), op=hvd.Sum, name=nm) for nm in order}
        for nm in names:
            assert torch.equal(hvd.synchronize(handles[nm]), torch.full((4,), float(n)))
    loop = _state.get().loop
    coord = loop.negotiation.coordinator if r == 0 else None  # type: ignore[union-attr]
    out: dict[str, object] = {}
    if coord is not None:
        out["repeated"] = coord.repeated_rounds
    before = loop.rounds
    time.sleep(0.5)
    out["idle rounds"] = loop.rounds - before  # nothing to do: the engine sleeps
    hvd.barrier()
    try:
        if r != 0:  # a cached name whose round rank 0 never sends
            hvd.allreduce(torch.ones(4), name="g0")
        else:
            time.sleep(5)  # rank 1 is stopped after 2 s
            hvd.allreduce(torch.ones(4), name="after")
    except hvd.HorovodInternalError as exc:
        out["error"] = str(exc)
    return out


def test_repeated_rounds_across_ranks() -> None:
    r0, r1 = hora.run(_repeated_rounds_job, np=2)
    assert r0["repeated"] >= 4, r0  # the steps after the first, and the lone "g0" never ran
    assert r0["idle rounds"] <= 2 and r1["idle rounds"] <= 2, (r0, r1)
    for res in (r0, r1):  # the round set aside was spilled where the stall inspector saw it
        assert "tensor 'allreduce.g0' waiting for" in res["error"], res
        assert "ready on ranks [1], missing on ranks [0]" in res["error"], res
