"""Name-keyed negotiation: which operations every rank has submitted, checked and in what order.

Rank 0 runs a `Coordinator` (pure logic, no I/O): every rank's requests arrive as they are
submitted, keyed by (process set, name), so the order of submission does not matter. When every
member of the process set (less the ranks that called `join`) has submitted a name, the requests
are validated against each other (`validation`); the ready ones are cut into fusion buckets
(`planning`) and sent to every rank, which then all run the same transport calls in the same order.
Requests every rank agreed on are remembered in the response cache (`cache`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

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
        # Repeated rounds (see `offer`): the rounds set aside by the rank (or subtree) that sent
        # them, the ids they share, how many ranks they cover, and since when.
        self.tree = tree if tree is not None else NegotiationTree(size, max(2, size))
        self._stash: dict[int, bool] = {}  # rank -> whether it stands for its whole subtree
        self._stash_ids: tuple[int, ...] = ()
        self._covered = 0
        self._stash_since = 0.0
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

    # ----- repeated rounds ---------------------------------------------------------------------
    def offer(self, rank: int, ids: tuple[int, ...], now: float, whole: bool = False) -> bool:
        """A training step submits the same operations in the same order every time, and once
        they are cached every rank sends nothing but their ids; `whole`: `rank` reports for its
        whole subtree of the negotiation tree (`relay`). Such a round is set aside (True) while
        every round so far is the very same sequence of ids of the global process set, with
        nothing else pending; once the whole world has it, `take` answers with the buckets
        planned for that sequence before, instead of matching each operation again (Horovod
        agrees on cached responses with a bit vector, without its coordinator, to the same end).
        False: submit them one by one, as usual (whatever was set aside went that way too)."""
        if not ids or self._pending or self._out or self._joined or rank in self._stash:
            self.spill()
            return False
        if self._stash:
            if ids != self._stash_ids:
                self.spill()
                return False
        elif not self._global(ids):
            return False
        else:
            self._stash_ids, self._stash_since = ids, now
        self._stash[rank] = whole
        self._covered += self.tree.subtree_size(rank) if whole else 1
        return True

    def _global(self, ids: tuple[int, ...]) -> bool:
        """Every id stands for a live request of the global process set (another set's round
        never has every rank: it is matched one by one, without waiting)."""
        by_id = self._by_id
        for cid in ids:
            req = by_id.get(cid)
            if req is None or req.process_set_id != 0:
                return False
        return True

    def spill(self) -> None:
        """Submit what was set aside one by one (a round differed, or it waited too long)."""
        if not self._stash:
            return
        stash, ids = self._stash, self._stash_ids
        self._stash, self._covered = {}, 0
        for rank, whole in stash.items():
            self.submit_round(rank, ids, whole)

    def submit_round(self, rank: int, ids: tuple[int, ...], whole: bool) -> None:
        """Submit a round of cache ids one by one, for every rank of `rank`'s subtree where
        `whole`."""
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
        """Some rank's round waits in `offer`'s stash."""
        return bool(self._stash)

    def stash_age(self, now: float) -> float | None:
        """How long the oldest round set aside has waited (None: none is)."""
        return now - self._stash_since if self._stash else None

    def _repeated_round(self) -> list[Bucket] | None:
        """The buckets for a round every rank set aside, planned once per sequence of ids."""
        if self._covered < self.size:
            return None
        ids = self._stash_ids
        buckets = self.cache.plans.get(ids)
        if buckets is None:
            members = self.members[0]
            ready: list[Ready] = []
            for cid in ids:
                req = self._by_id.get(cid)
                if req is None or req.process_set_id != 0:
                    return None  # dropped meanwhile: one by one
                ready.append((0, req.name, dict.fromkeys(members, req), -1, cid))
            buckets = self._plan(ready)
            self.cache.remember_plan(ids, buckets)
        self._stash, self._covered = {}, 0
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
        """Operations some member still owes (rounds set aside by `offer` are not counted)."""
        return bool(self._pending)

    def submit_cached(self, rank: int, cache_id: int) -> None:
        self.cached_submissions += 1
        req = self._by_id.get(cache_id)
        self.submit(rank, req if req is not None else self.cache.resolve(cache_id))

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
        if self._stash:
            repeated = self._repeated_round()
            if repeated is not None:
                return repeated  # type: ignore[return-value]
            if self._covered >= self.size:
                self.spill()  # an id no longer cached: planned one by one below
        out, self._out = self._out, []
        responses: list[Response] = []
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
