"""The one entry every door calls: run a function on the ranks a `RunConfig` describes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hora import _shipping, engines
from hora._payload import dumps_job
from hora.config import RunConfig
from hora.engines import AttemptSpec
from hora.job.driver import Job
from hora.job.group import WorkerGroup


def launch(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    config: RunConfig,
) -> list[Any]:
    """Run `fn(*args, **kwargs)` on `config.np` ranks; return every rank's value in rank order
    (only rank 0's, the others None, unless `config.collect_all`).

    The function is pickled and the engine checked (cluster, slots, Python) before anything
    starts; a bad value fails here with what to change.
    """
    return launch_with_metrics(fn, args, kwargs, config)[0]


def launch_with_metrics(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    config: RunConfig,
) -> tuple[list[Any], list[dict[str, Any]]]:
    """`launch`, and the history of the ranks' `hora.report` metrics, one dict per step."""
    if not callable(fn):
        raise TypeError(f"the training function must be callable, got {type(fn).__name__}")
    engine = engines.get(config.backend)
    payload: list[bytes] = []  # pickled once the first launcher says where the ranks run

    def pickled() -> bytes:
        return payload[0]

    def new_group(spec: AttemptSpec) -> WorkerGroup:
        launcher = engine.make_launcher(spec)
        if not payload:
            # The user's own modules go by value where the ranks cannot import them (other
            # machines); the engine's checks ran first, and still nothing has started.
            elsewhere = launcher.capabilities.ranks_run is engines.RanksRun.ELSEWHERE
            ships = _shipping.ships(spec.ship_code, elsewhere)
            by_value = _shipping.is_users_module if ships else None
            payload.append(dumps_job(fn, tuple(args), dict(kwargs), by_value))
        return WorkerGroup(launcher, engine.rank_setup)

    job = Job(config, pickled, new_group, capacity=engine.free_ranks)
    results = job.run()
    return results, job.metrics.history()
