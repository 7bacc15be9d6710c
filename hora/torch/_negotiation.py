"""Name-keyed negotiation: which operations every rank has submitted, checked and in what order.

Rank 0 runs a `Coordinator` (pure logic, no I/O): every rank's requests arrive as they are
submitted, keyed by (process set, name), so the order of submission does not matter. When every
member of the process set (less the ranks that called `join`) has submitted a name, the requests
are validated against each other; the ready ones are cut into fusion buckets and sent to every
rank, which then all run the same backend calls in the same order.
"""

from __future__ import annotations

from typing import NamedTuple

from hora.torch._common import OP_NAMES, Average, Sum

ALLREDUCE = "allreduce"
ALLGATHER = "allgather"
BROADCAST = "broadcast"
ALLTOALL = "alltoall"
REDUCESCATTER = "reducescatter"
BARRIER = "barrier"

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

    @property
    def ref(self) -> Request:
        return self.requests[min(self.requests)]


class Bucket(NamedTuple):
    """Operations run together: one fused backend call (per dtype) when `kind` is fusable."""

    kind: str
    process_set_id: int
    entries: list[Entry]


class Failure(NamedTuple):
    """An operation that failed validation: every member raises HorovodInternalError."""

    process_set_id: int
    name: str
    message: str


class JoinDone(NamedTuple):
    """Every rank has joined; `last_rank` joined last."""

    last_rank: int


Response = Bucket | Failure | JoinDone


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


class Coordinator:
    """Rank 0's bookkeeping of every rank's requests; `take()` hands out what may run now."""

    def __init__(self, size: int, fusion_threshold: int) -> None:
        self.size = size
        self.fusion_threshold = fusion_threshold
        self.members: dict[int, tuple[int, ...]] = {0: tuple(range(size))}
        self._pending: dict[tuple[int, str], dict[int, Request]] = {}
        self._joined: dict[int, None] = {}
        self._out: list[tuple[int, str, dict[int, Request]] | Failure | JoinDone] = []

    def set_process_set(self, process_set_id: int, ranks: tuple[int, ...] | None) -> None:
        """Register (or with None, forget) a process set; every rank does the same in order."""
        if ranks is None:
            self.members.pop(process_set_id, None)
        else:
            self.members[process_set_id] = ranks

    def pending_names(self) -> dict[str, list[int]]:
        """Names waiting for some rank, with the ranks that submitted them (for stall hints)."""
        return {name: sorted(reqs) for (_, name), reqs in self._pending.items()}

    def has_pending(self) -> bool:
        return bool(self._pending)

    def submit(self, rank: int, req: Request) -> None:
        key = (req.process_set_id, req.name)
        members = self.members.get(req.process_set_id)
        if members is None:
            self._out.append(
                Failure(req.process_set_id, req.name, f"Unknown process set {req.process_set_id}")
            )
            return
        self._pending.setdefault(key, {})[rank] = req
        self._check(key)

    def join(self, rank: int) -> None:
        self._joined[rank] = None
        for key in list(self._pending):
            self._check(key)
        if len(self._joined) == self.size:
            self._out.append(JoinDone(rank))
            self._joined.clear()

    def _check(self, key: tuple[int, str]) -> None:
        requests = self._pending[key]
        members = self.members[key[0]]
        if not all(r in requests for r in members if r not in self._joined):
            return
        del self._pending[key]
        message = validate(key[1], requests, members)
        if message is None and len(requests) < len(members):
            kind = next(iter(requests.values())).kind
            if kind == ALLTOALL:
                message = f"alltoall is not supported after a rank called join (tensor '{key[1]}')"
            elif kind == BROADCAST:
                root = next(iter(requests.values())).root
                if root not in requests:
                    message = f"Broadcast root rank {root} has already joined (tensor '{key[1]}')"
        if message is not None:
            self._out.append(Failure(key[0], key[1], message))
        else:
            self._out.append((key[0], key[1], requests))

    def take(self) -> list[Response]:
        """Everything decided since the last call, ready operations cut into fusion buckets."""
        out, self._out = self._out, []
        responses: list[Response] = []
        run: list[tuple[int, str, dict[int, Request]]] = []
        for item in out:
            if isinstance(item, tuple) and not isinstance(item, Failure | JoinDone):
                run.append(item)
                continue
            responses.extend(self._plan(run))
            run = []
            responses.append(item)
        responses.extend(self._plan(run))
        return responses

    def _plan(self, ready: list[tuple[int, str, dict[int, Request]]]) -> list[Bucket]:
        """Cut ready operations into buckets: same kind and signature, up to the threshold."""
        buckets: list[Bucket] = []
        open_buckets: dict[tuple[object, ...], tuple[Bucket, list[int]]] = {}
        for ps_id, name, requests in ready:
            ref = requests[min(requests)]
            keep_all = ref.kind in (ALLGATHER, ALLTOALL)
            entry = Entry(name, requests if keep_all else {min(requests): ref})
            nbytes = sum(r.nbytes for r in requests.values()) if keep_all else ref.nbytes
            if ref.kind not in _FUSABLE or self.fusion_threshold <= 0:
                buckets.append(Bucket(ref.kind, ps_id, [entry]))
                continue
            sig: tuple[object, ...] = (ref.kind, ps_id, ref.device)
            if ref.kind == ALLREDUCE:
                sig += (ref.op, ref.prescale, ref.postscale)
            elif ref.kind == BROADCAST:
                sig += (ref.root,)
            current = open_buckets.get(sig)
            if current is not None and current[1][0] + nbytes <= self.fusion_threshold:
                current[0].entries.append(entry)
                current[1][0] += nbytes
            else:
                bucket = Bucket(ref.kind, ps_id, [entry])
                buckets.append(bucket)
                open_buckets[sig] = (bucket, [nbytes])
        return buckets
