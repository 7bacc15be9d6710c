"""Fusion planning (Horovod's `FuseResponses`): rank 0 cuts the operations that became ready into
buckets, each run as one transport call (per dtype) on every rank.

Operations share a bucket when they agree on kind, process set, device and what the transport
call takes besides the data (the op's `OpSpec.fuses_on`: the reduction op and scale factors, a
root), up to the fusion threshold in bytes. An op whose spec has no `fuses_on` always
runs alone.
"""

from __future__ import annotations

from hora.collectives._control.cache import Signature
from hora.collectives._data.registry import OPS, PER_RANK_KINDS
from hora.collectives._messages import Bucket, Entry, Request

# kind -> what ops sharing a bucket agree on, for the kinds that fuse
_FUSES_ON = {kind: spec.fuses_on for kind, spec in OPS.items() if spec.fuses_on is not None}

# An operation every member is ready for: (process set, name, requests by rank, the cache id it
# announces (-1: none), the cache id it travels as (-1: not a hit)). A plain tuple: one is built
# per operation.
Ready = tuple[int, str, dict[int, Request], int, int]


def signature(requests: dict[int, Request], fusion_threshold: int) -> Signature:
    """Which ready operations may share a bucket (None: none, it runs alone) and the bytes it
    adds to one."""
    ref = requests[min(requests)]
    keep_all = ref.kind in PER_RANK_KINDS
    nbytes = sum(r.nbytes for r in requests.values()) if keep_all else ref.nbytes
    fuses_on = _FUSES_ON.get(ref.kind)
    if fuses_on is None or fusion_threshold <= 0:
        return None, nbytes
    return (ref.kind, ref.process_set_id, ref.device, *fuses_on(ref)), nbytes


def plan(
    ready: list[Ready], fusion_threshold: int, hit_signatures: dict[int, Signature]
) -> list[Bucket]:
    """Cut ready operations into buckets, in order: same signature, up to the threshold.
    `hit_signatures`: a cache hit's signature by its id, worked out at its first hit."""
    buckets: list[Bucket] = []
    open_buckets: dict[tuple[object, ...], tuple[Bucket, list[int]]] = {}
    for ps_id, name, requests, cid, hit in ready:
        if hit >= 0:
            # A hit travels as its id: its requests (all the same object) need no trimming.
            entry = Entry(name, requests, cid, hit)
            sig_bytes = hit_signatures.get(hit)
            if sig_bytes is None:
                sig_bytes = hit_signatures[hit] = signature(requests, fusion_threshold)
        else:
            low = min(requests)
            ref = requests[low]
            keep_all = ref.kind in PER_RANK_KINDS
            entry = Entry(name, requests if keep_all else {low: ref}, cid, hit)
            sig_bytes = signature(requests, fusion_threshold)
        sig, nbytes = sig_bytes
        if sig is None:
            buckets.append(Bucket(entry.ref.kind, ps_id, [entry]))
            continue
        current = open_buckets.get(sig)
        if current is not None and current[1][0] + nbytes <= fusion_threshold:
            current[0].entries.append(entry)
            current[1][0] += nbytes
        else:
            bucket = Bucket(sig[0], ps_id, [entry])  # type: ignore[arg-type]
            buckets.append(bucket)
            open_buckets[sig] = (bucket, [nbytes])
    return buckets
