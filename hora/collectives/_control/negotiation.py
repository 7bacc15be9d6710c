"""Name-keyed negotiation: which operations every rank has submitted, checked and in what order.

Rank 0 runs a `Coordinator` (pure logic, no I/O): every rank's requests arrive as they are
submitted, keyed by (process set, name), so the order of submission does not matter. When every
member of the process set (less the ranks that called `join`) has submitted a name, the requests
are validated against each other (`validation`); the ready ones are cut into fusion buckets
(`planning`) and sent to every rank, which then all run the same transport calls in the same order.
Requests every rank agreed on are remembered in the response cache (`cache`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from hora.collectives._control.cache import CoordinatorCache
from hora.collectives._control.planning import Ready, plan
from hora.collectives._control.tree import NegotiationTree
from hora.collectives._control.validation import join_refusal, validate
from hora.collectives._messages import (
    Bucket,
    Failure,
    JoinDone,
    Request,
    Response,
)

_NONAME = ".noname."  # in the names hora generates for unnamed operations


class _Count:
    """A cached operation's count so far: how many ranks sent its id, and who sent it (a rank,
    or a rank for its whole subtree)."""

    __slots__ = ("key", "ranks", "senders")

    def __init__(self, key: tuple[int, str]) -> None:
        self.key = key
        self.ranks = 0
        self.senders: dict[int, bool] = {}


class Coordinator:
    """Rank 0's bookkeeping of every rank's requests; `take()` hands out what may run now."""

    def __init__(
        self,
        size: int,
        fusion_threshold: int,
        cache_capacity: int = 1024,
        tree: NegotiationTree | None = None,
    ) -> None:
        self.size = size
        self.fusion_threshold = fusion_threshold
        self.members: dict[int, tuple[int, ...]] = {0: tuple(range(size))}
        self._pending: dict[tuple[int, str], dict[int, Request]] = {}
        self._joined: dict[int, None] = {}
        # Ready operations, and the failures and join completions in order among them.
        self._out: list[Ready | Failure | JoinDone] = []
        self.cache = CoordinatorCache(cache_capacity, range(1, size))
        # The cache's tables, read on every operation (see CoordinatorCache).
        self._cached = self.cache.entries
        self._by_id = self.cache.by_id
        self.cached_submissions = 0  # requests that arrived as a cache id (tests read it)
        # Cached operations agreed by count (see `receive_ids`): each id's ranks so far and
        # who sent it (a rank, or a whole subtree of the negotiation tree), since when, and the
        # ids every rank has sent, in order, for the next `take`.
        self.tree = tree if tree is not None else NegotiationTree(size, max(2, size))
        self._counted: dict[int, _Count] = {}
        self._counted_ids: dict[tuple[int, str], int] = {}  # (process set, name) -> its id
        self._counted_since = 0.0
        self._complete: list[int] = []
        self._acked_whole: dict[int, int] = {}  # subtree -> the drops all its ranks acked
        self.repeated_rounds = 0  # rounds answered from a plan (tests read it)

    def set_process_set(self, process_set_id: int, ranks: tuple[int, ...] | None) -> None:
        """Register (or with None, forget) a process set; every rank does the same in order."""
        self.spill()
        self.cache.plans.clear()
        if ranks is None:
            self.members.pop(process_set_id, None)
            self.cache.drop_process_set(process_set_id)
        else:
            self.members[process_set_id] = ranks

    # ----- cached operations, agreed by count --------------------------------------------------
    def receive_ids(self, rank: int, ids: Sequence[int], now: float, whole: bool = False) -> None:
        """Cache ids that `rank` sent (every rank of its subtree of the negotiation tree, where
        `whole`: `relay`). A training step submits the same operations every time, so once they
        are cached every rank sends nothing but their ids, and an operation of the global
        process set is ready once every rank has sent its id, whatever frames or order they came
        in: it is counted here, not matched by name, and `take` answers the ids ready together
        with the buckets planned for them before (Horovod agrees on cached responses with a bit
        vector, each bit ANDed over the ranks, to the same end). Anything else (another set's
        id, one dropped, one a rank also sent by name, a world with joined ranks) is submitted
        one by one, as usual."""
        counted = self._counted
        weight = self.tree.subtree_size(rank) if whole else 1
        for cid in ids:
            entry = counted.get(cid)
            if entry is None:
                req = self._by_id.get(cid)
                if self._joined or req is None or req.process_set_id != 0:
                    self._submit_ids(rank, (cid,), whole)
                    continue
                key = (0, req.name)
                if key in self._pending:
                    self._submit_ids(rank, (cid,), whole)
                    continue
                if not counted:
                    self._counted_since = now
                counted[cid] = entry = _Count(key)
                self._counted_ids[key] = cid
            elif rank in entry.senders:  # a second one before it ran: matched by name
                self._spill_id(cid)
                self._submit_ids(rank, (cid,), whole)
                continue
            entry.senders[rank] = whole
            entry.ranks += weight
            if entry.ranks >= self.size:
                del counted[cid]
                del self._counted_ids[entry.key]
                self._complete.append(cid)

    def spill(self) -> None:
        """Submit every counted id one by one (it waited too long: the stall inspector then sees
        who is missing; or a join or a process set changed the world's shape)."""
        for cid in list(self._counted):
            self._spill_id(cid)

    def _spill_id(self, cid: int) -> None:
        entry = self._counted.pop(cid, None)
        if entry is not None:
            del self._counted_ids[entry.key]
            for rank, whole in entry.senders.items():
                self._submit_ids(rank, (cid,), whole)

    def _submit_ids(self, rank: int, ids: Sequence[int], whole: bool) -> None:
        """Submit cache ids one by one, for every rank of `rank`'s subtree where `whole`."""
        for r in self.tree.subtree(rank) if whole else (rank,):
            for cid in ids:
                if r == 0:
                    self.submit(0, self.cache.resolve(cid))
                else:
                    self.submit_cached(r, cid)

    def ack(self, rank: int, drops_applied: int, whole: bool = False) -> None:
        """`rank` (every rank of its subtree where `whole`) had applied `drops_applied`
        CacheDrops when it chose the ids it just sent (see `CoordinatorCache.ack`)."""
        if not whole:
            self.cache.ack((rank,), drops_applied)
        elif self._acked_whole.get(rank) != drops_applied:
            self._acked_whole[rank] = drops_applied
            self.cache.ack(self.tree.subtree(rank), drops_applied)

    def has_set_aside(self) -> bool:
        """Some cached operation is counted and not ready yet."""
        return bool(self._counted)

    def stash_age(self, now: float) -> float | None:
        """How long the oldest counted operation has waited (None: none is)."""
        return now - self._counted_since if self._counted else None

    def _counted_round(self) -> list[Bucket]:
        """The buckets for the ids every rank has sent since the last take, planned once per
        sequence of ids; each is the most recently used in the cache now. An id evicted or
        dropped since it was first counted (its CacheDrop may have reached the ranks already)
        travels in full, not as its id."""
        ids = tuple(self._complete)
        self._complete = []
        entries, by_id = self._cached, self._by_id
        live = True
        for cid in ids:
            req = by_id.get(cid)
            if req is None:
                live = False
                continue
            key = (0, req.name)
            entries[key] = entries.pop(key)
        buckets = self.cache.plans.get(ids) if live else None
        if buckets is None:
            members = self.members[0]
            ready: list[Ready] = []
            for cid in ids:
                req = by_id.get(cid)
                if req is None:
                    req = self.cache.resolve(cid)
                    ready.append((0, req.name, dict.fromkeys(members, req), -1, -1))
                else:
                    ready.append((0, req.name, dict.fromkeys(members, req), -1, cid))
            buckets = self._plan(ready)
            if live:
                self.cache.remember_plan(ids, buckets)
        self.repeated_rounds += 1
        self.cached_submissions += (self.size - 1) * len(ids)
        return list(buckets)

    # ----- matching ----------------------------------------------------------------------------
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
        """Operations some member still owes by name (the counted ids are not among them)."""
        return bool(self._pending)

    def submit_cached(self, rank: int, cache_id: int) -> None:
        self.cached_submissions += 1
        req = self._by_id.get(cache_id)
        self.submit(rank, req if req is not None else self.cache.resolve(cache_id))

    def submit(self, rank: int, req: Request) -> None:
        key = (req.process_set_id, req.name)
        if self._counted:
            cid = self._counted_ids.get(key)
            if cid is not None:
                self._spill_id(cid)  # its ranks so far are matched by name, as this one
        members = self.members.get(req.process_set_id)
        if members is None:
            self._out.append(
                Failure(req.process_set_id, req.name, f"Unknown process set {req.process_set_id}")
            )
            return
        cached = self._cached.get(key)
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
            message = join_refusal(next(iter(requests.values())).kind, key[1])
        if message is not None:
            if key in self._cached:
                self.cache.drop(key)  # every rank forgets it: the next one is checked in full
            self._out.append(Failure(key[0], key[1], message))
            return
        self._out.append((key[0], key[1], requests, self._cache_id(key, requests, members), -1))

    def _cache_id(
        self, key: tuple[int, str], requests: dict[int, Request], members: tuple[int, ...]
    ) -> int:
        """The id a validated operation is cached under from now on (-1: not cached)."""
        # Generated names (".noname.<n>") never recur: caching them would only churn the cache.
        if self.cache.capacity <= 0 or len(requests) != len(members) or _NONAME in key[1]:
            return -1
        it = iter(requests.values())
        first = next(it)
        if all(r is first or r == first for r in it):
            return self.cache.remember(key, first)
        return -1

    def _hit(self, key: tuple[int, str], requests: dict[int, Request]) -> bool:
        """Every member sent the cached request (checked in full when it was cached): it is
        ready without validation, and travels to the workers as its id."""
        cached = self._cached.get(key)
        if cached is None:
            return False
        ref = cached[1]
        for r in requests.values():
            if r is not ref:
                return False
        del self._cached[key]
        self._cached[key] = cached  # most recently used
        self._out.append((key[0], key[1], requests, -1, cached[0]))
        return True

    # ----- decisions ---------------------------------------------------------------------------
    def take(self) -> list[Response]:
        """Everything decided since the last call, ready operations cut into fusion buckets."""
        responses: list[Response] = []
        if self._complete:
            responses.extend(self._counted_round())
        out, self._out = self._out, []
        run: list[Ready] = []
        for item in out:
            if type(item) is tuple:  # a ready operation (Failure and JoinDone are subclasses)
                run.append(item)  # type: ignore[arg-type]
                continue
            responses.extend(self._plan(run))
            run = []
            responses.append(item)  # type: ignore[arg-type]
        responses.extend(self._plan(run))
        # After the buckets that announce ids, so an id added and evicted in the same round is
        # forgotten on every rank too.
        drop = self.cache.take_drop()
        if drop is not None:
            responses.append(drop)
        return responses

    def _plan(self, ready: list[Ready]) -> list[Bucket]:
        return plan(ready, self.fusion_threshold, self.cache.signatures) if ready else []
