"""The collective loop's messages: what a rank asks rank 0 for, what rank 0 decides, and the
controls a caller's thread hands its own loop.

On the negotiation tree (`_control.tree`, `_control.channel`), one frame per round each way:
- a rank to its parent: a list of reports, each `(rank, whole, drops_applied, items)`, plain
  tuples (a NamedTuple costs ~5 us more per frame to pickle and unpickle, and a frame per
  operation is the common case). `whole` False: `rank`'s own round, where `drops_applied` counts
  the `CacheDrop`s it has applied and each item is a `Request`, a response-cache id (a bare int
  standing for a request, see `cache`), `Join`, `Stop`, or `Shutdown` (that rank's loop failed,
  or a child of it was lost); `whole` True: every rank of `rank`'s subtree sent the same round of
  cache ids (a tuple), `drops_applied` the fewest of theirs (`_control.relay`);
- rank 0 down the tree to every rank: a list of `Bucket`, `Failure`, `JoinDone`, `CacheDrop` and
  `Shutdown`, pickled once and passed on as it came.
`ProcessSetChange` only ever travels through a rank's own queue.

Every class here is small and pickles fast; the channel's restricted unpickler admits exactly
these. The loop tells them apart by `type(item) is ...` (a request is the common case).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from hora.collectives._common import Sum

# The kinds' wire names, for the modules that name a kind besides its own op's (the transports,
# the timeline, tests); each op's `OpSpec.kind` in `_data/algorithms/` is the one that counts.
ALLREDUCE = "allreduce"
ALLGATHER = "allgather"
BROADCAST = "broadcast"
ALLTOALL = "alltoall"
REDUCESCATTER = "reducescatter"
BARRIER = "barrier"


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
    """Operations run together: one fused transport call (per dtype) when `kind` is fusable.

    On the wire a cache hit travels as its bare id (`__reduce__`), which each worker turns back
    into an entry (`cache.expand`): pickling and unpickling a full entry cost ~15 us per
    operation.
    """

    kind: str
    process_set_id: int
    entries: list[Entry]

    def __reduce__(self) -> tuple[type, tuple[str, int, list[Entry | int]]]:
        entries = [e.cached if e.cached >= 0 else e for e in self.entries]
        return (Bucket, (self.kind, self.process_set_id, entries))


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


@dataclass(frozen=True)
class Shutdown:
    """Every rank's loop stops and fails what is pending with `reason`: sent by rank 0 to all, or
    by a worker whose loop failed (to rank 0, which then sends it to all)."""

    reason: str


@dataclass(frozen=True)
class Join:
    """A rank called `join()`: it contributes nothing (zeros) until every rank has joined."""


@dataclass(frozen=True)
class Stop:
    """A rank called `shutdown()`: rank 0 then stops every rank (an orderly end, no failure)."""


JOIN = Join()
STOP = Stop()


class ProcessSetChange(NamedTuple):
    """A process set registered (`ranks`) or removed (None); in order with the submissions, so
    rank 0's coordinator learns it before any operation of the set."""

    process_set_id: int
    ranks: tuple[int, ...] | None


Response = Bucket | Failure | JoinDone | CacheDrop
