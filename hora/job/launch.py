"""The one entry every door calls: run a function on the ranks a `RunConfig` describes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from hora import _shipping, engines
from hora._payload import dumps_job
from hora.config import RunConfig
from hora.job.driver import Attempt, Job
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
    first = engine.make_launcher(config)
    # The user's own modules go by value where the ranks cannot import them (other machines).
    ship = _shipping.ships(config.ship_code, bool(getattr(first, "ranks_elsewhere", False)))
    by_value = _shipping.is_users_module if ship else None
    payload = dumps_job(fn, tuple(args), dict(kwargs), by_value)

    def new_group(attempt: Attempt, env: Mapping[str, str]) -> WorkerGroup:
        if attempt.index == 0:
            launcher = first
        else:  # an elastic run's attempt may have another size
            sized = dataclasses.replace(config, np=attempt.np)
            launcher = engine.make_launcher(sized, restart=True)
        return WorkerGroup(attempt.np, launcher, env)

    def capacity(held: int) -> int:
        return engine.free_ranks(config, held)

    job = Job(config, payload, new_group, capacity=capacity, commits_here=engine.on_this_host)
    results = job.run()
    return results, job.metrics.history()
