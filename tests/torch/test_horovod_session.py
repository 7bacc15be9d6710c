"""A Horovod user's pytest session, run unchanged in every rank of one 2-rank job.

`horovodrun -np 2 pytest test_torch.py` runs one pytest session per rank: tests that fail on
purpose, shutdown and re-init, join, process sets, every alltoall, sparse reductions and
optimizer-state broadcast follow one another in one process, and one test's failure must not
break the next. Each test of the suite is asserted here on both ranks.
"""

from __future__ import annotations

import pytest

import hora
from tests.torch.horovod_session import session

NP = 2
SKIPPED_WITHOUT_GPU = {"test_horovod_alltoall_splits_on_gpu"}


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    # Horovod's own suite runs with dynamic process sets (its tests add and remove sets).
    env = {"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}
    return hora.run(session.run_session, np=NP, env=env, timeout=600)


def _names() -> list[str]:
    from tests.torch.horovod_session.horovod_torch_suite import TorchTests

    return sorted(n for n in dir(TorchTests) if n.startswith("test_"))


def test_every_rank_session_passes(ranks: list[dict]) -> None:
    assert len(ranks) == NP
    for r, result in enumerate(ranks):
        assert result["exit"] == 0, f"rank {r}: " + "\n".join(result["failures"].values())


@pytest.mark.parametrize("name", _names())
def test_suite_case(ranks: list[dict], name: str) -> None:
    import torch

    want = "skipped" if name in SKIPPED_WITHOUT_GPU and not torch.cuda.is_available() else "passed"
    key = f"TorchTests::{name}"
    for r, result in enumerate(ranks):
        got = result["outcomes"].get(key)
        assert got == want, f"rank {r}: {got}\n{result['failures'].get(key, '')}"


def test_no_warning_from_inside_reaches_the_user(ranks: list[dict]) -> None:
    """Warnings a test's own lines cause are the user's business (e.g. `average=`); any other
    comes from inside hora or torch, and no user should see it."""
    for r, result in enumerate(ranks):
        inside = [w["text"] for w in result["warnings"] if w["filename"] != session.SUITE]
        assert not inside, f"rank {r}: " + "\n".join(inside)
