"""A third party's engine, registered from this module (no edit of hora), runs a real job.

The toy engine starts each rank as a process of this machine, as the local engine does, but
through its own launcher and with its own rank-side setup, which the worker runs before the job.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import pytest

import hora
from hora import engines, environment
from hora.engines import AttemptSpec, Engine, LaunchContext, Launcher
from hora.engines.process import WorkerProcess, stop_all
from hora.engines.rendezvous import host_store
from hora.errors import WorkerFailedError
from hora.wire.protocol import Boot, Exited, Output

LOOPBACK = "127.0.0.1"
SETUP_VAR = "TOY_ENGINE_SETUP"


class ToyLauncher(Launcher):
    """Ranks as processes of this machine; keeps the spec it was given, for the test to read."""

    built: list[AttemptSpec] = []

    def __init__(self, spec: AttemptSpec) -> None:
        self.spec = spec
        self.workers: list[WorkerProcess] = []
        self.store = None
        ToyLauncher.built.append(spec)

    def start(self, ctx: LaunchContext) -> None:
        self.store, port = host_store(LOOPBACK)
        for place in environment.placements([LOOPBACK] * self.spec.np):
            env = environment.worker_env(place, LOOPBACK, port, user_env=self.spec.env)
            self.workers.append(_process(ctx, place.rank, env))

    def stop(self) -> None:
        stop_all(self.workers, 3.0)
        self.workers, self.store = [], None


def _process(ctx: LaunchContext, rank: int, env: dict[str, str]) -> WorkerProcess:
    return WorkerProcess(
        ctx.boot(rank),
        env,
        on_line=lambda stream, line: ctx.report(Output(rank, stream, line)),
        on_exit=lambda code: ctx.report(Exited(rank, code)),
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


@pytest.fixture
def toy() -> Iterator[Engine]:
    ToyLauncher.built.clear()
    engines.register(TOY)
    try:
        yield TOY
    finally:
        engines.unregister(TOY.name)


def test_a_registered_engine_runs_a_two_rank_job_with_its_rank_setup(toy):
    assert hora.run(what_the_rank_sees, np=2, backend="toy") == [
        ("rank 0 set up by the toy engine", "2"),
        ("rank 1 set up by the toy engine", "2"),
    ]
    [spec] = ToyLauncher.built  # all the launcher got of the run
    assert (spec.np, spec.attempt, spec.restart, spec.options) == (2, 0, False, {})
    assert spec.env["HORA_MAX_RESTARTS"] == "0"


def test_the_registry_orders_lists_and_refuses_a_taken_name(toy):
    assert engines.names() == ("spark", "ray", "toy", "local")  # before this machine's
    assert engines.resolve("auto") == "local"  # not active: auto never picks it
    with pytest.raises(ValueError, match="an engine named 'toy' is registered already"):
        engines.register(TOY)
    with pytest.raises(TypeError, match=r"takes a hora\.engines\.Engine"):
        engines.register("toy")  # type: ignore[arg-type]
    engines.register(dataclasses.replace(TOY, summary="replaced"), override=True)
    assert engines.names() == ("spark", "ray", "toy", "local")
    assert engines.get("toy").summary == "replaced"


def test_a_failing_rank_setup_is_the_ranks_failure_told_as_any_other(toy):
    failing = dataclasses.replace(TOY, rank_setup=f"{__name__}:failing_rank_setup")
    engines.register(failing, override=True)
    with pytest.raises(WorkerFailedError, match="the toy engine could not set up rank"):
        hora.run(what_the_rank_sees, np=2, backend="toy")


def test_an_unregistered_engine_is_gone():
    with pytest.raises(ValueError, match=r"backend must be one of \('spark', 'ray', 'local'\)"):
        hora.run(what_the_rank_sees, np=2, backend="toy")
