"""Name-keyed negotiation: which operations every rank has submitted, checked and in what order.

Rank 0 runs a `Coordinator` (pure logic, no I/O): every rank's requests arrive as they are
submitted, keyed by (process set, name), so the order of submission does not matter. When every
member of the process set (less the ranks that called `join`) has submitted a name, the requests
are validated against each other; the ready ones are cut into fusion buckets and sent to every
rank, which then all run the same backend calls in the same order.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import NamedTuple

from hora.collectives._common import OP_NAMES, Average, Sum

ALLREDUCE = "allreduce"
ALLGATHER = "allgather"
BROADCAST = "broadcast"
ALLTOALL = "alltoall"
REDUCESCATTER = "reducescatter"
BARRIER = "barrier"

_NONAME = ".noname."  # in the names the engine generates for unnamed operations

# Fusion signature of each fusable kind: which request fields must agree to share one buffer.
_FUSABLE = {ALLREDUCE, ALLGATHER, BROADCAST}


class Request(NamedTuple):
    """One rank's request for one (possibly grouped) operation; small so it pickles fast."""

    name: str
    kind: str
    process_set_id: int
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    device: str  # "cpu" or "cuda"
    nbytes: int
    op: int = Sum
    prescale: float = 1.0
    postscale: float = 1.0
    root: int = -1
    splits: tuple[tuple[int, ...], ...] | None = None


class Entry(NamedTuple):
    """A validated operation inside a bucket.

    `requests` maps rank -> request: every submitting rank for allgather and alltoall (whose
    sizes differ per rank), only the lowest one otherwise.
    """

    name: str
    requests: dict[int, Request]
    cache_id: int = -1  # >= 0: every rank now knows this request's signature by this id
    cached: int = -1  # >= 0: a response-cache hit: every rank already knows it by this id

    @property
    def ref(self) -> Request:
        return self.requests[min(self.requests)]


class Bucket(NamedTuple):
    """Operations run together: one fused backend call (per dtype) when `kind` is fusable.

    On the wire a cache hit travels as its bare id (`__reduce__`), which each worker turns back
    into an entry (`expand`): pickling and unpickling a full entry cost ~15 us per operation.
    """

    kind: str
    process_set_id: int
    entries: list[Entry]

    def __reduce__(self) -> tuple[type, tuple[str, int, list[Entry | int]]]:
        entries = [e.cached if e.cached >= 0 else e for e in self.entries]
        return (Bucket, (self.kind, self.process_set_id, entries))  # type: ignore[return-value]


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
    keep_all = bucket.kind in (ALLGATHER, ALLTOALL)
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


class Failure(NamedTuple):
    """An operation that failed validation: every member raises HorovodInternalError."""

    process_set_id: int
    name: str
    message: str


class JoinDone(NamedTuple):
    """Every rank has joined; `last_rank` joined last."""

    last_rank: int


class CacheDrop(NamedTuple):
    """Response-cache ids every rank forgets (evicted, replaced or invalidated by a mismatch)."""

    ids: tuple[int, ...]


Response = Bucket | Failure | JoinDone | CacheDrop


def _shape(s: tuple[int, ...]) -> list[int]:
    return list(s)


def validate(name: str, requests: dict[int, Request], members: tuple[int, ...]) -> str | None:
    """Why the ranks' requests for `name` cannot run together, or None when they agree."""
    ranks = sorted(requests)
    first_rank = ranks[0]
    first = requests[first_rank]
    # Fast path: agreeing ranks send equal requests (tuple equality in C); only a mismatch or a
    # kind whose shapes differ per rank (allgather, alltoall) needs the field-by-field messages.
    slow = [rank for rank in ranks[1:] if requests[rank] != first]
    for rank in slow:
        req = requests[rank]
        where = f"rank {first_rank} has {{a}}, rank {rank} has {{b}} (tensor '{name}')"
        if req.kind != first.kind:
            return "Mismatched collective operations: " + where.format(a=first.kind, b=req.kind)
        if len(req.dtypes) != len(first.dtypes):
            return "Mismatched number of tensors in a grouped operation: " + where.format(
                a=len(first.dtypes), b=len(req.dtypes)
            )
        if req.dtypes != first.dtypes:
            return f"Mismatched {first.kind} data types: " + where.format(
                a=", ".join(first.dtypes), b=", ".join(req.dtypes)
            )
        if req.device != first.device:
            return f"Mismatched {first.kind} devices: " + where.format(a=first.device, b=req.device)
        if first.kind in (ALLREDUCE, BROADCAST, REDUCESCATTER):
            for s1, s2 in zip(first.shapes, req.shapes, strict=True):
                if s1 != s2:
                    return f"Mismatched {first.kind} tensor shapes: " + where.format(
                        a=_shape(s1), b=_shape(s2)
                    )
        if first.kind in (ALLGATHER, ALLTOALL):
            for s1, s2 in zip(first.shapes, req.shapes, strict=True):
                if len(s1) != len(s2) or s1[1:] != s2[1:]:
                    return (
                        f"Mismatched {first.kind} tensor shapes (all dimensions but the first "
                        "must agree): " + where.format(a=_shape(s1), b=_shape(s2))
                    )
        if first.kind in (ALLREDUCE, REDUCESCATTER):
            if req.op != first.op:
                return f"Mismatched {first.kind} reduction ops: " + where.format(
                    a=OP_NAMES.get(first.op, first.op), b=OP_NAMES.get(req.op, req.op)
                )
            if (req.prescale, req.postscale) != (first.prescale, first.postscale):
                return f"Mismatched {first.kind} scale factors: " + where.format(
                    a=(first.prescale, first.postscale), b=(req.prescale, req.postscale)
                )
        if first.kind == BROADCAST and req.root != first.root:
            return "Mismatched broadcast root ranks: " + where.format(a=first.root, b=req.root)
    if first.kind == BROADCAST and first.root not in members:
        return f"Broadcast root rank {first.root} is not in the process set (tensor '{name}')"
    if first.kind == REDUCESCATTER and first.op not in (Average, Sum):
        return f"Reducescatter supports only Average and Sum (tensor '{name}')"
    return None


# Horovod's controller refuses these while a member has joined (a joined rank has no tensor to
# contribute rows or a root's data from); the ranks that submitted get the error, joined ranks
# go on waiting in join(). Allreduce (zeros) and reducescatter (zeros) go ahead.
_JOIN_REFUSALS = {
    ALLGATHER: "Allgather is not supported with Join at this time. Specify sparse_as_dense=True "
    "if using DistributedOptimizer",
    BROADCAST: "Broadcast is not supported with Join at this time.",
    ALLTOALL: "Alltoall is not supported with Join at this time.",
}


def _join_refusal(kind: str, name: str) -> str | None:
    refusal = _JOIN_REFUSALS.get(kind)
    return None if refusal is None else f"{refusal} (tensor '{name}')"


class Coordinator:
    """Rank 0's bookkeeping of every rank's requests; `take()` hands out what may run now."""

    def __init__(self, size: int, fusion_threshold: int, cache_capacity: int = 1024) -> None:
        self.size = size
        self.fusion_threshold = fusion_threshold
        self.members: dict[int, tuple[int, ...]] = {0: tuple(range(size))}
        self._pending: dict[tuple[int, str], dict[int, Request]] = {}
        self._joined: dict[int, None] = {}
        # Ready operations as (process set, name, requests, new cache id, hit cache id).
        self._out: list[tuple[int, str, dict[int, Request], int, int] | Failure | JoinDone] = []
        # Response cache (Horovod's): a request every rank agreed on gets an id, which workers
        # then send instead of the pickled request. Keyed by (process set, name), in LRU order;
        # ids are never reused. A dropped id stays resolvable ("retired") until every worker has
        # acknowledged the CacheDrop (a worker may have sent it before it saw the drop).
        self.cache_capacity = cache_capacity
        self._cache: dict[tuple[int, str], tuple[int, Request]] = {}
        self._by_id: dict[int, Request] = {}
        # A live id's fusion signature and byte count (see `_plan`), worked out once.
        self._hit_plans: dict[int, tuple[tuple[object, ...] | None, int]] = {}
        self._retired: dict[int, tuple[Request, int]] = {}
        self._next_id = 0
        self._dropping: list[int] = []
        self._drop_seq = 0  # CacheDrop messages sent so far
        self._acked: dict[int, int] = {r: 0 for r in range(1, size)}
        self.cached_submissions = 0  # requests that arrived as a cache id (tests read it)
        # Repeated rounds (see `offer`): the rounds set aside, since when, and the buckets
        # planned before for a sequence of ids (forgotten whenever an id is dropped).
        self._stash: dict[int, tuple[int, ...]] = {}
        self._stash_since = 0.0
        self._plans: dict[tuple[int, ...], list[Bucket]] = {}
        self.repeated_rounds = 0  # rounds answered from `_plans` (tests read it)

    def set_process_set(self, process_set_id: int, ranks: tuple[int, ...] | None) -> None:
        """Register (or with None, forget) a process set; every rank does the same in order."""
        self.spill()
        self._plans.clear()
        if ranks is None:
            self.members.pop(process_set_id, None)
            for key in [k for k in self._cache if k[0] == process_set_id]:
                self._drop(key)
        else:
            self.members[process_set_id] = ranks

    # ----- response cache ----------------------------------------------------------------------
    def resolve(self, cache_id: int) -> Request:
        """The request a worker sent as `cache_id` (live, or dropped but not yet acknowledged)."""
        req = self._by_id.get(cache_id)
        if req is None:
            retired = self._retired.get(cache_id)
            if retired is None:
                raise RuntimeError(f"unknown response-cache id {cache_id}")
            req = retired[0]
        return req

    # ----- repeated rounds ---------------------------------------------------------------------
    def offer(self, rank: int, ids: tuple[int, ...], now: float) -> bool:
        """A training step submits the same operations in the same order every time, and once
        they are cached every rank sends rank 0 nothing but their ids. Such a round is set
        aside (True) while every rank's round so far is the very same sequence of ids, with
        nothing else pending; once all have it, `take` answers with the buckets planned for
        that sequence before, instead of matching each operation again (Horovod agrees on
        cached responses with a bit vector, without its coordinator, to the same end).
        False: submit them one by one, as usual (whatever was set aside went that way too)."""
        if not ids or self._pending or self._out or self._joined or rank in self._stash:
            self.spill()
            return False
        if self._stash:
            if ids != next(iter(self._stash.values())):
                self.spill()
                return False
        else:
            self._stash_since = now
        self._stash[rank] = ids
        return True

    def own_ids(self, items: list[object]) -> tuple[int, ...] | None:
        """Rank 0's own round as cache ids, or None unless every item is a cached request."""
        ids = []
        cache = self._cache
        for req in items:
            if type(req) is not Request:
                return None
            hit = cache.get((req.process_set_id, req.name))
            if hit is None or not (hit[1] is req or hit[1] == req):
                return None
            ids.append(hit[0])
        return tuple(ids)

    def spill(self) -> None:
        """Submit what was set aside one by one (a round differed, or it waited too long)."""
        if not self._stash:
            return
        stash, self._stash = self._stash, {}
        for rank, ids in stash.items():
            for cid in ids:
                if rank == 0:
                    self.submit(0, self.resolve(cid))
                else:
                    self.submit_cached(rank, cid)

    def has_set_aside(self) -> bool:
        """Some rank's round waits in `offer`'s stash."""
        return bool(self._stash)

    def stash_age(self, now: float) -> float | None:
        """How long the oldest round set aside has waited (None: none is)."""
        return now - self._stash_since if self._stash else None

    def _repeated_round(self) -> list[Bucket] | None:
        """The buckets for a round every rank set aside, planned once per sequence of ids."""
        if len(self._stash) < self.size:
            return None
        ids = self._stash[0]
        plan = self._plans.get(ids)
        if plan is None:
            members = self.members[0]
            ready: list[tuple[int, str, dict[int, Request], int, int]] = []
            for cid in ids:
                req = self._by_id.get(cid)
                if req is None or req.process_set_id != 0:
                    return None  # dropped meanwhile, or another set's: one by one
                ready.append((0, req.name, dict.fromkeys(members, req), -1, cid))
            if len(self._plans) >= 64:
                self._plans.clear()
            plan = self._plans[ids] = self._plan(ready)
        self._stash = {}
        self.repeated_rounds += 1
        self.cached_submissions += (self.size - 1) * len(ids)
        return list(plan)

    def submit_cached(self, rank: int, cache_id: int) -> None:
        self.cached_submissions += 1
        req = self._by_id.get(cache_id)
        self.submit(rank, req if req is not None else self.resolve(cache_id))

    def ack(self, rank: int, drop_seq: int) -> None:
        """`rank` had applied `drop_seq` CacheDrops when it chose the ids it just sent."""
        self._acked[rank] = drop_seq
        if self._retired:
            done = min(self._acked.values(), default=self._drop_seq)
            for cid in [c for c, (_, seq) in self._retired.items() if seq <= done]:
                del self._retired[cid]

    def cache_ids(self) -> dict[tuple[int, str], int]:
        """The live cache (for tests and stall hints): key -> id."""
        return {key: cid for key, (cid, _) in self._cache.items()}

    def _drop(self, key: tuple[int, str]) -> None:
        self._plans.clear()
        cid, req = self._cache.pop(key)
        del self._by_id[cid]
        self._hit_plans.pop(cid, None)
        self._retired[cid] = (req, self._drop_seq + 1)  # announced by the next CacheDrop
        self._dropping.append(cid)

    def _remember(self, key: tuple[int, str], ref: Request) -> int:
        """Cache an agreed request; the new id (to announce), or -1 on a hit."""
        cached = self._cache.pop(key, None)
        if cached is not None:
            if cached[1] == ref:
                self._cache[key] = cached  # most recently used
                return -1
            self._cache[key] = cached
            self._drop(key)
        cid = self._next_id
        self._next_id += 1
        self._cache[key] = (cid, ref)
        self._by_id[cid] = ref
        while len(self._cache) > self.cache_capacity:
            self._drop(next(iter(self._cache)))
        return cid

    @property
    def pending(self) -> Mapping[tuple[int, str], Mapping[int, Request]]:
        """(process set, name) -> the requests received so far, for operations some member still
        owes; each waiting instance has a table of its own (the stall inspector relies on it)."""
        return self._pending

    @property
    def joined(self) -> Collection[int]:
        """Ranks that called join while the others have not (nothing is owed by them)."""
        return self._joined

    def has_pending(self) -> bool:
        """Operations some member still owes (rounds set aside by `offer` are not counted)."""
        return bool(self._pending)

    def submit(self, rank: int, req: Request) -> None:
        if self._stash:
            self.spill()  # first, in the order the rounds came
        key = (req.process_set_id, req.name)
        members = self.members.get(req.process_set_id)
        if members is None:
            self._out.append(
                Failure(req.process_set_id, req.name, f"Unknown process set {req.process_set_id}")
            )
            return
        cached = self._cache.get(key)
        if cached is not None and (cached[1] is req or cached[1] == req):
            req = cached[1]  # the cached object itself: `_check` recognises a hit by identity
        requests = self._pending.get(key)
        if requests is None:
            self._pending[key] = requests = {}
        requests[rank] = req
        if len(requests) + len(self._joined) >= len(members):  # else some member is missing
            self._check(key)

    def join(self, rank: int) -> None:
        self.spill()
        self._joined[rank] = None
        for key in list(self._pending):
            self._check(key)
        if len(self._joined) == self.size:
            self._out.append(JoinDone(rank))
            self._joined.clear()

    def _check(self, key: tuple[int, str]) -> None:
        requests = self._pending[key]
        members = self.members[key[0]]
        joined = self._joined
        for r in members:
            if r not in requests and r not in joined:
                return
        del self._pending[key]
        if len(requests) == len(members) and self._hit(key, requests):
            return
        message = validate(key[1], requests, members)
        if message is None and len(requests) < len(members):
            message = _join_refusal(next(iter(requests.values())).kind, key[1])
        if message is not None:
            if key in self._cache:
                self._drop(key)  # every rank forgets it: the next submission is checked in full
            self._out.append(Failure(key[0], key[1], message))
            return
        cid = -1
        # Generated names (".noname.<n>") never recur: caching them would only churn the cache.
        if self.cache_capacity > 0 and len(requests) == len(members) and _NONAME not in key[1]:
            it = iter(requests.values())
            first = next(it)
            if all(r is first or r == first for r in it):
                cid = self._remember(key, first)
        self._out.append((key[0], key[1], requests, cid, -1))

    def _hit(self, key: tuple[int, str], requests: dict[int, Request]) -> bool:
        """Every member sent the cached request (checked in full when it was cached): it is
        ready without validation, and travels to the workers as its id."""
        cached = self._cache.get(key)
        if cached is None:
            return False
        ref = cached[1]
        for r in requests.values():
            if r is not ref:
                return False
        del self._cache[key]
        self._cache[key] = cached  # most recently used
        self._out.append((key[0], key[1], requests, -1, cached[0]))
        return True

    def take(self) -> list[Response]:
        """Everything decided since the last call, ready operations cut into fusion buckets."""
        if self._stash:
            repeated = self._repeated_round()
            if repeated is not None:
                return repeated  # type: ignore[return-value]
            if len(self._stash) == self.size:
                self.spill()  # an id no longer cached: planned one by one below
        out, self._out = self._out, []
        responses: list[Response] = []
        run: list[tuple[int, str, dict[int, Request], int, int]] = []
        for item in out:
            if type(item) is tuple:  # a ready operation (Failure and JoinDone are subclasses)
                run.append(item)  # type: ignore[arg-type]
                continue
            responses.extend(self._plan(run))
            run = []
            responses.append(item)  # type: ignore[arg-type]
        responses.extend(self._plan(run))
        if self._dropping:
            # After the buckets that announce ids, so an id added and evicted in the same round
            # is forgotten on every rank too.
            responses.append(CacheDrop(tuple(self._dropping)))
            self._dropping = []
            self._drop_seq += 1
            if not self._acked:  # a world of one: nobody can still send a dropped id
                self._retired.clear()
        return responses

    def _plan(self, ready: list[tuple[int, str, dict[int, Request], int, int]]) -> list[Bucket]:
        """Cut ready operations into buckets: same kind and signature, up to the threshold."""
        buckets: list[Bucket] = []
        open_buckets: dict[tuple[object, ...], tuple[Bucket, list[int]]] = {}
        hit_plans = self._hit_plans
        for ps_id, name, requests, cid, hit in ready:
            if hit >= 0:
                # A hit travels as its id: its requests (all the same object) need no trimming,
                # and its signature was worked out when it was first planned as a hit.
                entry = Entry(name, requests, cid, hit)
                plan = hit_plans.get(hit)
                if plan is None:
                    plan = hit_plans[hit] = self._signature(requests)
            else:
                low = min(requests)
                ref = requests[low]
                keep_all = ref.kind in (ALLGATHER, ALLTOALL)
                entry = Entry(name, requests if keep_all else {low: ref}, cid, hit)
                plan = self._signature(requests)
            sig, nbytes = plan
            if sig is None:
                buckets.append(Bucket(entry.ref.kind, ps_id, [entry]))
                continue
            current = open_buckets.get(sig)
            if current is not None and current[1][0] + nbytes <= self.fusion_threshold:
                current[0].entries.append(entry)
                current[1][0] += nbytes
            else:
                bucket = Bucket(sig[0], ps_id, [entry])  # type: ignore[arg-type]
                buckets.append(bucket)
                open_buckets[sig] = (bucket, [nbytes])
        return buckets

    def _signature(self, requests: dict[int, Request]) -> tuple[tuple[object, ...] | None, int]:
        """Which ready operations may share a bucket (None: none, it runs alone) and the bytes
        it adds to one."""
        ref = requests[min(requests)]
        keep_all = ref.kind in (ALLGATHER, ALLTOALL)
        nbytes = sum(r.nbytes for r in requests.values()) if keep_all else ref.nbytes
        if ref.kind not in _FUSABLE or self.fusion_threshold <= 0:
            return None, nbytes
        sig: tuple[object, ...] = (ref.kind, ref.process_set_id, ref.device)
        if ref.kind == ALLREDUCE:
            sig += (ref.op, ref.prescale, ref.postscale)
        elif ref.kind == BROADCAST:
            sig += (ref.root,)
        return sig, nbytes
