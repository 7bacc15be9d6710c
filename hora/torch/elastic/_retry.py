"""The elastic retry loop: restore, re-initialise, re-sync, call again."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

from hora.torch.elastic.state import State
from hora.torch.mpi_ops import HorovodInternalError, init, shutdown

log = logging.getLogger(__name__)

R = TypeVar("R")

# A fixed world cannot heal a persistent fault; retrying forever would only hide it.
_RESET_LIMIT_ENV = "HORA_ELASTIC_RESET_LIMIT"
_DEFAULT_RESET_LIMIT = 10


def run(func: Callable[..., R]) -> Callable[..., R]:
    """Decorate `func(state, *args, **kwargs)` to be retried from `state`'s last commit.

    Before each attempt `state.sync()` makes every rank hold rank 0's state. On
    `HorovodInternalError` the state is restored, hora.torch is shut down and initialised again,
    the reset callbacks run, and `func` is called again; after `HORA_ELASTIC_RESET_LIMIT`
    (default 10) resets the error is re-raised.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> R:
        limit = int(os.environ.get(_RESET_LIMIT_ENV, _DEFAULT_RESET_LIMIT))
        resets = 0
        while True:
            state.sync()
            try:
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                if resets >= limit:
                    raise
                log.warning("collective failed; restoring the last commit and re-initialising")
                state.restore()
            resets += 1
            shutdown()
            init()
            state.on_reset()

    return wrapper
