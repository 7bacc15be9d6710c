"""What keeps one operation cheap, checked for behaviour (never for time): cache hits travel as
bare ids and are expanded on every worker, submissions gather into one bucket until a caller
blocks, and an async operation still progresses with nobody waiting for it."""

from __future__ import annotations

import math
import pickle

import hora
from hora.collectives._control import channel as _channel
from hora.collectives._control.cache import expand
from hora.collectives._control.negotiation import Coordinator
from hora.collectives._control.submissions import GATHER_CYCLES, SubmissionQueue
from hora.collectives._messages import ALLGATHER, ALLREDUCE, Bucket, Entry, Request


def req(name: str, kind: str = ALLREDUCE, shape=(4,)) -> Request:
    return Request(name, kind, 0, ("float32",), (tuple(shape),), "cpu", 4 * math.prod(shape))


def _agree(c: Coordinator, reqs: list[Request], ranks: int) -> list:
    for r in range(ranks):
        for q in reqs:
            c.submit(r, q)
    return c.take()


def test_a_hit_travels_as_its_id_and_every_worker_expands_it() -> None:
    c = Coordinator(3, 1 << 20)
    names = [f"t{k}" for k in range(200)]
    (first,) = _agree(c, [req(n) for n in names], 3)
    assert all(e.cache_id >= 0 and e.cached < 0 for e in first.entries)
    # rank 0 builds fresh (equal, not identical) requests; workers send ids
    for n in names:
        c.submit(0, req(n))
    for e in first.entries:
        c.submit_cached(1, e.cache_id)
        c.submit_cached(2, e.cache_id)
    (hit,) = c.take()
    assert [e.cached for e in hit.entries] == [e.cache_id for e in first.entries]
    assert all(e.cache_id == -1 for e in hit.entries)  # a hit announces nothing
    wire_first, wire_hit = _channel.pack([first]), _channel.pack([hit])
    assert len(wire_hit) < len(wire_first) / 10, (len(wire_hit), len(wire_first))
    # a worker: learns the ids from the first bucket, then expands the hits
    known: dict[int, Request] = {}
    received = _channel.loads(wire_first)[0]
    expand(received, known, (0, 1, 2))
    received = _channel.loads(wire_hit)[0]
    assert all(type(e) is int for e in received.entries)
    expand(received, known, (0, 1, 2))
    assert [(e.name, e.ref) for e in received.entries] == [(n, req(n)) for n in names]


def test_an_id_announced_and_hit_in_one_bucket_expands_in_order() -> None:
    c = Coordinator(2, 1 << 20)
    c.submit(0, req("a"))
    c.submit(1, req("a"))  # ready: cached, id announced in this round
    c.submit(0, req("a"))
    c.submit(1, req("a"))  # the same name again before take(): a hit of that id
    (bucket,) = c.take()
    announced, again = bucket.entries
    assert announced.cache_id >= 0 and again.cached == announced.cache_id
    received = pickle.loads(pickle.dumps(bucket))
    expand(received, {}, (0, 1))
    assert [e.ref for e in received.entries] == [req("a"), req("a")]


def test_an_allgather_hit_expands_to_every_member() -> None:
    bucket = Bucket(ALLGATHER, 0, [7])  # type: ignore[list-item]
    expand(bucket, {7: req("g", ALLGATHER, (2, 3))}, (0, 1, 2))
    (entry,) = bucket.entries
    assert isinstance(entry, Entry) and sorted(entry.requests) == [0, 1, 2]
    assert entry.ref == req("g", ALLGATHER, (2, 3)) and entry.cached == 7


def test_a_hit_expands_to_the_entry_made_for_its_id_and_fusion_plans_stay_right() -> None:
    c = Coordinator(2, 3 * 16)  # room for three 16-byte requests per bucket
    names = [f"m{k}" for k in range(5)]
    first = _agree(c, [req(n) for n in names], 2)
    known: dict[int, Request] = {}
    made: dict[int, Entry] = {}
    for b in first:
        expand(pickle.loads(pickle.dumps(b)), known, (0, 1), made)
    for _ in range(2):  # the second round reuses the hits' signatures and entries
        hits = _agree(c, [req(n) for n in names], 2)
        assert [[e.name for e in b.entries] for b in hits] == [names[:3], names[3:]]
        got = [pickle.loads(pickle.dumps(b)) for b in hits]
        for b in got:
            expand(b, known, (0, 1), made)
        assert [e.ref for b in got for e in b.entries] == [req(n) for n in names]
    assert len(made) == 5
    again = pickle.loads(pickle.dumps(hits[0]))
    expand(again, known, (0, 1), made)
    assert again.entries[0] is made[hits[0].entries[0].cached]


def test_a_changed_request_is_not_taken_for_a_hit() -> None:
    c = Coordinator(2, 1 << 20)
    _agree(c, [req("a")], 2)
    c.submit(0, req("a", shape=(5,)))
    c.submit(1, req("a", shape=(5,)))
    bucket, drop = c.take()  # checked in full, cached again under a new id
    (entry,) = bucket.entries
    assert entry.cached == -1 and entry.cache_id >= 0 and entry.ref == req("a", shape=(5,))
    assert drop.ids == (0,)


def test_gathering_follows_a_caller_still_submitting_for_a_few_cycles_at_most() -> None:
    def due(first: float, last: float) -> float:
        queue = SubmissionQueue(cycle_time_s=1.0)
        queue.last_queued = last
        return queue.due_at(first)

    assert due(10.0, 10.0) == 11.0  # one submission: one cycle
    assert due(10.0, 12.5) == 13.5  # still submitting: a cycle after the latest one
    assert due(10.0, 100.0) == 10.0 + GATHER_CYCLES  # a caller that never blocks is still served
    assert due(10.0, 3.0) == 11.0  # taken after the latest submission (a join): one cycle


def _batches_job() -> dict[str, object]:
    """Runs on every rank with HOROVOD_CYCLE_TIME long: nothing is sent before a caller blocks."""
    import torch

    import hora.torch as hvd
    from hora.collectives._control import state as _state
    from hora.collectives._data import transports as _backends

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    ts = [torch.full((k % 7 + 1,), float(r + 1)) for k in range(200)]
    buckets = []
    for _ in range(3):
        for t in ts:
            t.fill_(float(r + 1))
        before = _backends.stats["buckets"]
        handles = [hvd.allreduce_async_(t, op=hvd.Sum, name=f"b{k}") for k, t in enumerate(ts)]
        for h in handles:
            hvd.synchronize(h)
        buckets.append(_backends.stats["buckets"] - before)
        assert all(torch.equal(t, torch.full_like(t, n * (n + 1) / 2)) for t in ts)
    negotiation = _state.get().loop.negotiation
    coord = negotiation.coordinator if r == 0 else None  # type: ignore[union-attr]
    cached = coord.cached_submissions if coord is not None else None
    hvd.shutdown()
    return {"buckets": buckets, "cached": cached}


def test_a_batch_gathers_into_one_bucket_and_repeats_as_cache_hits() -> None:
    results = hora.run(_batches_job, np=2, env={"HOROVOD_CYCLE_TIME": "5000"}, timeout=120)
    assert all(res["buckets"] == [1, 1, 1] for res in results), results
    assert results[0]["cached"] == 2 * 200  # rank 1 sent ids in the 2nd and 3rd batches


def _progress_job() -> list[float]:
    """Rank 0 submits and then blocks elsewhere (a gloo barrier) before synchronizing: its engine
    must take the request without being flushed, or rank 1 never returns and nobody does."""
    import torch
    import torch.distributed as dist

    import hora.torch as hvd

    hvd.init()
    r = hvd.rank()
    out = []
    for k in range(3):
        h = hvd.allreduce_async(torch.ones(3) * (r + 1), op=hvd.Sum, name=f"p{k}")
        if r == 0:
            dist.barrier()
            out.append(float(hvd.synchronize(h)[0]))
        else:
            out.append(float(hvd.synchronize(h)[0]))
            dist.barrier()
    hvd.shutdown()
    return out


def test_an_async_op_progresses_while_its_caller_blocks_elsewhere() -> None:
    assert hora.run(_progress_job, np=2, timeout=120) == [[3.0] * 3] * 2
