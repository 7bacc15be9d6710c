"""A third party's engine, written against hora's public face only (`hora.engines`): each rank a
process of this machine, as the local engine's, with its own launcher and rank-side setup.

Registered by a test (`hora.engines.register`), or found through an entry point
(`tests/engines/test_entry_points.py`: `toyep = tests.engines._toy:entry_point_engine`).
"""

from __future__ import annotations

import dataclasses
import os

from hora import engines
from hora.engines import AttemptSpec, Boot, Engine, LaunchContext, Launcher, WorkerProcess

LOOPBACK = "127.0.0.1"
SETUP_VAR = "TOY_ENGINE_SETUP"


class ToyLauncher(Launcher):
    """Ranks as processes of this machine; keeps every spec it was given, for a test to read."""

    built: list[AttemptSpec] = []

    def __init__(self, spec: AttemptSpec) -> None:
        self.spec = spec
        self.workers: list[WorkerProcess] = []
        self.store: object = None
        ToyLauncher.built.append(spec)

    def start(self, ctx: LaunchContext) -> None:
        self.store, port = engines.host_store(LOOPBACK)
        for place in engines.placements([LOOPBACK] * self.spec.np):
            env = engines.worker_env(place, LOOPBACK, port, user_env=self.spec.env)
            self.workers.append(_process(ctx, place.rank, env))

    def stop(self) -> None:
        engines.stop_all(self.workers, 3.0)
        self.workers, self.store = [], None


def _process(ctx: LaunchContext, rank: int, env: dict[str, str]) -> WorkerProcess:
    return WorkerProcess(
        ctx.boot(rank),
        env,
        on_line=lambda stream, line: ctx.report(engines.Output(rank, stream, line)),
        on_exit=lambda code: ctx.report(engines.Exited(rank, code)),
        cwd=os.getcwd(),
    )


def toy_rank_setup(boot: Boot) -> None:
    """The toy engine's rank-side setup: runs in each rank's process, before the job."""
    os.environ[SETUP_VAR] = f"rank {boot.rank} set up by the toy engine"


def failing_rank_setup(boot: Boot) -> None:
    raise RuntimeError(f"the toy engine could not set up rank {boot.rank}")


def what_the_rank_sees() -> tuple[str | None, str | None]:
    return os.environ.get(SETUP_VAR), os.environ.get("WORLD_SIZE")


TOY = Engine(
    name="toy",
    is_active=lambda: False,
    launcher=f"{__name__}:ToyLauncher",
    rank_setup=f"{__name__}:toy_rank_setup",
    summary="a test's engine",
)


def entry_point_engine() -> Engine:
    """The toy engine as a distribution declares it: an entry point may load to a callable."""
    return dataclasses.replace(TOY, name="toyep", summary="a toy engine found by its entry point")
