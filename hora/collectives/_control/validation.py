"""Whether the ranks' requests for one name may run together, and Horovod's words when not.

Agreeing ranks send equal requests, so the common case is one tuple comparison per rank (in C);
only a mismatch, or a kind whose shapes differ per rank (allgather, alltoall), is looked at field
by field to say what differs.
"""

from __future__ import annotations

from hora.collectives._common import OP_NAMES, Average, Sum
from hora.collectives._messages import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    BROADCAST,
    PER_RANK_KINDS,
    REDUCESCATTER,
    Request,
)

_SAME_SHAPES = (ALLREDUCE, BROADCAST, REDUCESCATTER)
_REDUCING = (ALLREDUCE, REDUCESCATTER)

# Horovod's controller refuses these while a member has joined (a joined rank has no tensor to
# contribute rows or a root's data from); the ranks that submitted get the error, joined ranks
# go on waiting in join(). Allreduce (zeros) and reducescatter (zeros) go ahead.
_JOIN_REFUSALS = {
    ALLGATHER: "Allgather is not supported with Join at this time. Specify sparse_as_dense=True "
    "if using DistributedOptimizer",
    BROADCAST: "Broadcast is not supported with Join at this time.",
    ALLTOALL: "Alltoall is not supported with Join at this time.",
}


def validate(name: str, requests: dict[int, Request], members: tuple[int, ...]) -> str | None:
    """Why the ranks' requests for `name` cannot run together, or None when they agree."""
    ranks = sorted(requests)
    first_rank = ranks[0]
    first = requests[first_rank]
    for rank in ranks[1:]:
        req = requests[rank]
        if req != first:
            where = f"rank {first_rank} has {{a}}, rank {rank} has {{b}} (tensor '{name}')"
            message = _mismatch(first, req, where)
            if message is not None:
                return message
    if first.kind == BROADCAST and first.root not in members:
        return f"Broadcast root rank {first.root} is not in the process set (tensor '{name}')"
    if first.kind == REDUCESCATTER and first.op not in (Average, Sum):
        return f"Reducescatter supports only Average and Sum (tensor '{name}')"
    return None


def join_refusal(kind: str, name: str) -> str | None:
    """Why `kind` cannot run while some member has joined, or None when it can."""
    refusal = _JOIN_REFUSALS.get(kind)
    return None if refusal is None else f"{refusal} (tensor '{name}')"


def _mismatch(first: Request, req: Request, where: str) -> str | None:
    """What differs between two ranks' requests that must agree; `where` names them."""
    kind = first.kind
    if req.kind != kind:
        return "Mismatched collective operations: " + where.format(a=kind, b=req.kind)
    if len(req.dtypes) != len(first.dtypes):
        return "Mismatched number of tensors in a grouped operation: " + where.format(
            a=len(first.dtypes), b=len(req.dtypes)
        )
    if req.dtypes != first.dtypes:
        return f"Mismatched {kind} data types: " + where.format(
            a=", ".join(first.dtypes), b=", ".join(req.dtypes)
        )
    if req.device != first.device:
        return f"Mismatched {kind} devices: " + where.format(a=first.device, b=req.device)
    return _shape_mismatch(first, req, where) or _parameter_mismatch(first, req, where)


def _shape_mismatch(first: Request, req: Request, where: str) -> str | None:
    kind = first.kind
    for s1, s2 in zip(first.shapes, req.shapes, strict=True):
        if kind in _SAME_SHAPES and s1 != s2:
            return f"Mismatched {kind} tensor shapes: " + where.format(a=list(s1), b=list(s2))
        if kind in PER_RANK_KINDS and (len(s1) != len(s2) or s1[1:] != s2[1:]):
            return (
                f"Mismatched {kind} tensor shapes (all dimensions but the first must agree): "
                + where.format(a=list(s1), b=list(s2))
            )
    return None


def _parameter_mismatch(first: Request, req: Request, where: str) -> str | None:
    kind = first.kind
    if kind in _REDUCING and req.op != first.op:
        return f"Mismatched {kind} reduction ops: " + where.format(
            a=OP_NAMES.get(first.op, first.op), b=OP_NAMES.get(req.op, req.op)
        )
    if kind in _REDUCING and (req.prescale, req.postscale) != (first.prescale, first.postscale):
        return f"Mismatched {kind} scale factors: " + where.format(
            a=(first.prescale, first.postscale), b=(req.prescale, req.postscale)
        )
    if kind == BROADCAST and req.root != first.root:
        return "Mismatched broadcast root ranks: " + where.format(a=first.root, b=req.root)
    return None
