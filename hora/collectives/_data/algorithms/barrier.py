"""Barrier: nothing to move, since the negotiation that agreed on it was the barrier itself."""

from __future__ import annotations

from hora.collectives._data.algorithms import set_outputs
from hora.collectives._data.groups import GroupInfo
from hora.collectives._data.local_op import LocalOp
from hora.collectives._data.op_spec import OpSpec
from hora.collectives._messages import BARRIER, Bucket


def run(bucket: Bucket, ops: list[LocalOp | None], info: GroupInfo, device: str) -> None:
    set_outputs(ops, [[] for _ in ops])


SPEC = OpSpec(kind=BARRIER, run=run, faces={"collectives": ("barrier",)})
