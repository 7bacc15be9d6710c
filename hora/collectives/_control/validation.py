"""Whether the ranks' requests for one name may run together, and Horovod's words when not.

Agreeing ranks send equal requests, so the common case is one tuple comparison per rank (in C);
only a mismatch, or a kind whose shapes differ per rank (`OpSpec.per_rank_shapes`), is looked at
field by field to say what differs. What each kind adds (the parameters its ranks agree on, a
check once they do, a refusal during a join) is its `OpSpec`'s.
"""

from __future__ import annotations

from hora.collectives._data.registry import OPS, PER_RANK_KINDS
from hora.collectives._messages import Request

# Horovod's controller refuses some kinds while a member has joined (a joined rank has no tensor
# to contribute rows or a root's data from): the ranks that submitted get the error, joined ranks
# go on waiting in join(). The other kinds go ahead, the joined ranks contributing zeros.
_JOIN_REFUSALS = {kind: spec.join_refusal for kind, spec in OPS.items() if spec.join_refusal}
_MISMATCHES = {kind: spec.mismatch for kind, spec in OPS.items() if spec.mismatch is not None}
_CHECKS = {kind: spec.check for kind, spec in OPS.items() if spec.check is not None}


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
    check = _CHECKS.get(first.kind)
    return None if check is None else check(first, members, name)


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
    if message := _shape_mismatch(first, req, where):
        return message
    mismatch = _MISMATCHES.get(kind)
    return None if mismatch is None else mismatch(first, req, where)


def _shape_mismatch(first: Request, req: Request, where: str) -> str | None:
    kind = first.kind
    for s1, s2 in zip(first.shapes, req.shapes, strict=True):
        if kind not in PER_RANK_KINDS and s1 != s2:
            return f"Mismatched {kind} tensor shapes: " + where.format(a=list(s1), b=list(s2))
        if kind in PER_RANK_KINDS and (len(s1) != len(s2) or s1[1:] != s2[1:]):
            return (
                f"Mismatched {kind} tensor shapes (all dimensions but the first must agree): "
                + where.format(a=list(s1), b=list(s2))
            )
    return None
