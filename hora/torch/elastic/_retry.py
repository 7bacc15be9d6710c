"""`hvd.elastic.run` for PyTorch: Horovod's retry loop (`hora.collectives.elastic.run`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from hora.collectives import elastic

R = TypeVar("R")


def run(func: Callable[..., R]) -> Callable[..., R]:
    """Decorate `func(state, *args, **kwargs)` to be retried from `state`'s last commit, and
    resumed by a new attempt of another size, and re-formed in place when a rank is lost (see
    `hora.collectives.elastic.run`)."""
    return elastic.run(func, in_place=True, grow_in_place=True)
