"""What one collective op is, in one place: `OpSpec`, which each module of `algorithms/`
declares as its `SPEC` beside the `run` it names.

From the specs the control room derives its tables (which kinds fuse and on what, whose shapes
differ per rank, what must agree between ranks, what a join refuses), the data room its dispatch
(`execute`), and the frameworks their public names (`faces`), so that an op's facts are written
once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from hora.collectives._common import OP_NAMES
from hora.collectives._data.groups import GroupInfo
from hora.collectives._data.local_op import LocalOp
from hora.collectives._messages import Bucket, Request

#: Runs one agreed bucket on this rank: `ops[i]` is this rank's submission for the bucket's i-th
#: entry (None where it joined), results land in each op's `outputs`.
Algorithm = Callable[[Bucket, list[LocalOp | None], GroupInfo, str], None]

#: What differs between two ranks' requests beyond kind, dtypes, device and shapes, in Horovod's
#: words, or None when they agree: (the first rank's, another rank's, "rank a has {a}, ...").
Mismatch = Callable[[Request, Request, str], "str | None"]

#: Why agreeing requests still cannot run, or None: (the request, the set's members, its name).
Check = Callable[[Request, tuple[int, ...], str], "str | None"]

#: The request's fields, besides kind, process set and device, that ops sharing a bucket agree on.
FusesOn = Callable[[Request], tuple[object, ...]]

#: The framework faces a spec may name: the neutral calls of `hora.collectives`, and those of
#: `hora.torch`, `hora.tensorflow` and `hora.tensorflow.keras`.
FRAMEWORKS = ("collectives", "torch", "tensorflow", "keras")


@dataclass(frozen=True)
class OpSpec:
    """One collective op: its wire kind, how it is planned and checked, how it runs, and the
    public names each framework gives it."""

    #: the kind its requests and buckets carry on the wire
    kind: str
    #: how a bucket of it runs on this rank
    run: Algorithm
    #: None: each op runs alone in its bucket; else what ops sharing one must agree on
    fuses_on: FusesOn | None = None
    #: the ranks' shapes differ in dim 0 (or in splits): rank 0 keeps every rank's request
    per_rank_shapes: bool = False
    #: what else the ranks' requests must agree on (reduction op, root), in Horovod's words
    mismatch: Mismatch | None = None
    #: checked once the ranks agree (a root outside the set, an op it does not support)
    check: Check | None = None
    #: Horovod's refusal while a member has joined (no tensor to contribute); None: the joined
    #: rank contributes zeros
    join_refusal: str | None = None
    #: framework (`FRAMEWORKS`) -> the public names it gives this op
    faces: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.faces) - set(FRAMEWORKS)
        if unknown:
            raise ValueError(f"{self.kind}: faces for unknown frameworks {sorted(unknown)}")


def reduction_mismatch(first: Request, req: Request, where: str) -> str | None:
    """Ops that reduce agree on the reduction op and the scale factors."""
    kind = first.kind
    if req.op != first.op:
        return f"Mismatched {kind} reduction ops: " + where.format(
            a=OP_NAMES.get(first.op, first.op), b=OP_NAMES.get(req.op, req.op)
        )
    if (req.prescale, req.postscale) != (first.prescale, first.postscale):
        return f"Mismatched {kind} scale factors: " + where.format(
            a=(first.prescale, first.postscale), b=(req.prescale, req.postscale)
        )
    return None


def reduction_parameters(req: Request) -> tuple[object, ...]:
    """Reductions fuse when they agree on the op and the scale factors."""
    return (req.op, req.prescale, req.postscale)
