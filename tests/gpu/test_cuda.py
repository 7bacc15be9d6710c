"""hora.torch on CUDA tensors: the whole conformance suite again, with every tensor on a GPU.

Skipped where torch sees no GPU (CI has none); run on a GPU machine. With a GPU per rank the
collectives go through NCCL; where ranks share a GPU (NCCL refuses that) they go through gloo
by way of host copies, and the suite must pass either way.
"""

from __future__ import annotations

import pytest
import torch

import hora
from tests.collectives import _cases
from tests.gpu import _cuda_cases

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SIZES = (2, 3)  # the cases assume more than one rank


@pytest.fixture(scope="module")
def outcomes() -> dict[int, list[tuple[dict[str, str], dict[str, int]]]]:
    return {np: hora.run(_cuda_cases.run_all_on_cuda, np=np) for np in SIZES}


@pytest.mark.parametrize("np", SIZES)
@pytest.mark.parametrize("case", list(_cases.CASES))
def test_case_on_cuda(outcomes, case: str, np: int) -> None:
    failures = {r: o[case] for r, (o, _) in enumerate(outcomes[np]) if o.get(case) != "ok"}
    assert not failures, "\n".join(f"rank {r}: {text}" for r, text in failures.items())


@pytest.mark.parametrize("np", SIZES)
def test_backend_follows_gpu_sharing(outcomes, np: int) -> None:
    """NCCL when each rank has a GPU of its own, host-staged gloo when they share."""
    for _, stats in outcomes[np]:
        nccl, staged = stats.get("cuda_nccl_calls", 0), stats.get("cuda_staged_calls", 0)
        if torch.cuda.device_count() >= np:
            assert nccl > 0 and staged == 0, stats
        else:
            assert staged > 0 and nccl == 0, stats


def test_distributed_optimizer_trains_on_cuda() -> None:
    losses = hora.run(_cuda_cases.train_on_cuda, np=2)
    first, last = losses[0]
    assert last < first / 2, losses
    assert losses[0] == losses[1]  # same weights on both ranks, so the same full-batch loss
