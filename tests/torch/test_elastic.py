"""hvd.elastic: ElasticSampler, TorchState commit/restore/sync, and run() recovering from a real
collective failure.

One job per world size runs every case (see _layer_cases); each test asserts one case per rank.
"""

from __future__ import annotations

import pytest

from tests.torch import _layer_cases as cases

GROUP = "elastic"


@pytest.fixture(scope="module")
def outcomes() -> cases.Outcomes:
    return cases.Outcomes(GROUP)


@pytest.mark.parametrize(("case", "np"), cases.params(GROUP))
def test_case(outcomes: cases.Outcomes, case: str, np: int) -> None:
    outcomes.check(case, np)
