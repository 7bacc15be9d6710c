"""The layer above the collectives, on real ranks (the cases live in _layer_cases):

- optimizer: DistributedOptimizer equals one process on the global batch; accumulation, fusion
  groups, sparse and fp16 gradients, every error case;
- functions: broadcast_parameters, broadcast_optimizer_state (several optimizers),
  broadcast_object, allgather_object;
- sync_batch_norm: SyncBatchNorm equals BatchNorm over the global batch (forward, gradients,
  running stats);
- elastic: ElasticSampler, TorchState commit/restore/sync, run() recovering from a real
  collective failure.

One job per (group, world size) runs every case of the group, on first use; each test asserts
one case on every rank.
"""

from __future__ import annotations

import pytest

from tests.torch import _layer_cases as cases

GROUPS = ("optimizer", "functions", "sync_batch_norm", "elastic")
_OUTCOMES = {group: cases.Outcomes(group) for group in GROUPS}


@pytest.mark.parametrize(
    ("group", "case", "np"),
    [(group, case, np) for group in GROUPS for case, np in cases.params(group)],
)
def test_case(group: str, case: str, np: int) -> None:
    _OUTCOMES[group].check(case, np)
