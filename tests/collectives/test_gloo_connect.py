"""How gloo connects a world's groups (`_rendezvous.choose_gloo_connect`): every rank of a world
decides alike, by that world's size, each time a world is made. Ranks of one gloo group that
connect at once and on first use crash each other (SIGSEGV in gloo's connectFullMesh): a running
rank re-forming into a world grown in place past LAZY_GLOO_FROM must connect as its new ranks
do (tests/scale/test_np64.py grows a real world from 31 to 32 ranks)."""

from __future__ import annotations

import pytest

from hora.collectives import _rendezvous
from hora.collectives._rendezvous import LAZY_GLOO_FROM, LAZY_GLOO_VAR, choose_gloo_connect


@pytest.fixture
def clean(monkeypatch):
    monkeypatch.delenv(LAZY_GLOO_VAR, raising=False)
    monkeypatch.setattr(_rendezvous, "_lazy_chosen", False)
    return monkeypatch


def test_a_rank_connects_each_world_as_that_worlds_size_says(clean) -> None:
    import os

    sizes = [LAZY_GLOO_FROM - 1, LAZY_GLOO_FROM, LAZY_GLOO_FROM + 4, LAZY_GLOO_FROM - 4]
    seen = []
    for size in sizes:  # a rank's worlds: started below, grown past, grown, shrunk below
        choose_gloo_connect(size)
        seen.append(os.environ.get(LAZY_GLOO_VAR))
    assert seen == [None, "1", "1", None]


@pytest.mark.parametrize("value", ["0", "1"])
def test_the_users_own_setting_is_kept_at_every_size(clean, value: str) -> None:
    import os

    clean.setenv(LAZY_GLOO_VAR, value)
    for size in (2, LAZY_GLOO_FROM, 2):
        choose_gloo_connect(size)
        assert os.environ[LAZY_GLOO_VAR] == value
