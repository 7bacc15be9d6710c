"""The response cache (Horovod's `response_cache.cc`): a request every rank agreed on gets an id,
and travels as that id from then on, both ways.

Rank 0 keeps the `CoordinatorCache`: agreed requests by (process set, name), in LRU order, under
ids that are never reused. It announces a new id in the bucket that carries the request
(`Entry.cache_id`), sends a hit as the bare id (`Bucket.__reduce__`), and forgets ids with a
`CacheDrop` after the buckets of the same round.

Every worker keeps a `WorkerCache`: it learns the ids announced, sends a request rank 0 knows as
its id (`encode`), turns received ids back into entries (`expand`), and applies every `CacheDrop`.
A worker may have sent an id before it saw the drop, so rank 0 keeps a dropped id resolvable
("retired") until every worker has acknowledged the drop: each frame says how many drops its
sender had applied when it chose the ids (`drops_applied`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from hora.collectives._data.registry import PER_RANK_KINDS
from hora.collectives._messages import Bucket, CacheDrop, Entry, Request

DEFAULT_CAPACITY = 1024
MAX_PLANS = 64  # repeated rounds whose buckets are remembered (`CoordinatorCache.plans`)

Key = tuple[int, str]  # (process set, name)
Signature = tuple[tuple[object, ...] | None, int]  # fusion signature and bytes (`planning`)


def capacity_from_env() -> int:
    """HOROVOD_CACHE_CAPACITY (0 disables the response cache); rank 0's value is the one used."""
    return int(os.environ.get("HOROVOD_CACHE_CAPACITY", DEFAULT_CAPACITY))


class CoordinatorCache:
    """Rank 0's half. `entries`, `by_id`, `signatures` and `plans` are read directly by the
    coordinator on every operation (a method call each would cost more than the lookup)."""

    def __init__(self, capacity: int, workers: Sequence[int]) -> None:
        self.capacity = capacity
        self.entries: dict[Key, tuple[int, Request]] = {}  # LRU order, most recent last
        self.by_id: dict[int, Request] = {}  # live ids
        # Worked out once per live id, and per sequence of live ids (a repeated round's
        # buckets, see `Coordinator.receive_ids`); forgotten whenever an id is dropped.
        self.signatures: dict[int, Signature] = {}
        self.plans: dict[tuple[int, ...], list[Bucket]] = {}
        self._retired: dict[int, tuple[Request, int]] = {}  # id -> (request, its drop's number)
        self._next_id = 0
        self._dropping: list[int] = []
        self._drops_sent = 0
        self._acked: dict[int, int] = dict.fromkeys(workers, 0)

    def ids(self) -> dict[Key, int]:
        """The live cache (for tests and stall hints): key -> id."""
        return {key: cid for key, (cid, _) in self.entries.items()}

    def resolve(self, cache_id: int) -> Request:
        """The request a worker sent as `cache_id` (live, or dropped but not yet acknowledged)."""
        req = self.by_id.get(cache_id)
        if req is None:
            retired = self._retired.get(cache_id)
            if retired is None:
                raise RuntimeError(f"unknown response-cache id {cache_id}")
            req = retired[0]
        return req

    def ack(self, ranks: Iterable[int], drops_applied: int) -> None:
        """Each of `ranks` had applied at least `drops_applied` CacheDrops when it chose the ids
        it just sent (a subtree's report gives its fewest: a rank's count only grows)."""
        acked = self._acked
        for rank in ranks:
            if acked.get(rank, 0) < drops_applied:
                acked[rank] = drops_applied
        if self._retired:
            done = min(self._acked.values(), default=self._drops_sent)
            for cid in [c for c, (_, seq) in self._retired.items() if seq <= done]:
                del self._retired[cid]

    def own_ids(self, items: list[object]) -> tuple[int, ...] | None:
        """Rank 0's own round as cache ids, or None unless every item is a cached request."""
        ids = []
        entries = self.entries
        for req in items:
            if type(req) is not Request:
                return None
            hit = entries.get((req.process_set_id, req.name))
            if hit is None or not (hit[1] is req or hit[1] == req):
                return None
            ids.append(hit[0])
        return tuple(ids)

    def remember(self, key: Key, ref: Request) -> int:
        """Cache an agreed request; the new id (to announce), or -1 when it was cached already."""
        cached = self.entries.pop(key, None)
        if cached is not None:
            self.entries[key] = cached  # most recently used
            if cached[1] == ref:
                return -1
            self.drop(key)
        cid = self._next_id
        self._next_id += 1
        self.entries[key] = (cid, ref)
        self.by_id[cid] = ref
        while len(self.entries) > self.capacity:
            self.drop(next(iter(self.entries)))
        return cid

    def drop(self, key: Key) -> None:
        """Forget `key`'s id; every rank forgets it with the next `take_drop`."""
        self.plans.clear()
        cid, req = self.entries.pop(key)
        del self.by_id[cid]
        self.signatures.pop(cid, None)
        self._retired[cid] = (req, self._drops_sent + 1)  # announced by the next CacheDrop
        self._dropping.append(cid)

    def drop_process_set(self, process_set_id: int) -> None:
        for key in [k for k in self.entries if k[0] == process_set_id]:
            self.drop(key)

    def remember_plan(self, ids: tuple[int, ...], plan: list[Bucket]) -> None:
        if len(self.plans) >= MAX_PLANS:
            self.plans.clear()
        self.plans[ids] = plan

    def take_drop(self) -> CacheDrop | None:
        """The ids dropped since the last call, as the CacheDrop every worker applies."""
        if not self._dropping:
            return None
        drop = CacheDrop(tuple(self._dropping))
        self._dropping = []
        self._drops_sent += 1
        if not self._acked:  # a world of one: nobody can still send a dropped id
            self._retired.clear()
        return drop


class WorkerCache:
    """A worker's half: which of its requests rank 0 knows by an id, and what an id stands for."""

    def __init__(self) -> None:
        # (process set, name) -> (id, request): looked up by name (a short key whose string was
        # hashed already), then the request compared; a Request is a tuple whose hash is
        # recomputed at every lookup.
        self.ids: dict[Key, tuple[int, Request]] = {}
        self.requests: dict[int, Request] = {}  # id -> request
        self._entries: dict[int, Entry] = {}  # what a hit's id expands to, built once
        self.drops_applied = 0

    def encode(self, items: list[object]) -> list[object]:
        """`items` to send, each request rank 0 knows replaced by its id."""
        ids = self.ids
        sent: list[object] = []
        for item in items:
            if type(item) is Request:
                hit = ids.get((item.process_set_id, item.name))
                if hit is not None and (hit[1] is item or hit[1] == item):
                    item = hit[0]
            sent.append(item)
        return sent

    def learn(self, bucket: Bucket, ranks: tuple[int, ...]) -> None:
        """Expand the hits of a received bucket and remember the ids it announces; `ranks`: the
        process set's members."""
        expand(bucket, self.requests, ranks, self._entries)
        for e in bucket.entries:
            if e.cache_id >= 0:
                req = self.requests[e.cache_id]
                self.ids[(req.process_set_id, req.name)] = (e.cache_id, req)

    def forget(self, drop: CacheDrop) -> None:
        for cid in drop.ids:
            self._entries.pop(cid, None)
            req = self.requests.pop(cid, None)
            key = (req.process_set_id, req.name) if req is not None else None
            if key is not None and self.ids.get(key, (-1,))[0] == cid:
                del self.ids[key]
        self.drops_applied += 1


def expand(
    bucket: Bucket,
    known: dict[int, Request],
    ranks: tuple[int, ...],
    made: dict[int, Entry] | None = None,
) -> None:
    """Turn a received bucket's bare cache ids back into entries, in place, and add the ids it
    announces to `known` (id -> request) as they come; `ranks`: the process set's members (a
    hit had every member). `made`: entries already built for ids (an entry of a hit is the
    same every time; the caller forgets an id's entry when it forgets the id)."""
    entries: list[Entry | int] = bucket.entries  # type: ignore[assignment]
    keep_all = bucket.kind in PER_RANK_KINDS
    first = ranks[0] if ranks else 0
    for i, e in enumerate(entries):
        if type(e) is int:
            entry = made.get(e) if made is not None else None
            if entry is None:
                req = known[e]
                requests = dict.fromkeys(ranks, req) if keep_all else {first: req}
                entry = Entry(req.name, requests, -1, e)
                if made is not None and ranks:
                    made[e] = entry
            entries[i] = entry
        elif e.cache_id >= 0:  # type: ignore[union-attr]
            known[e.cache_id] = e.ref  # type: ignore[union-attr]
