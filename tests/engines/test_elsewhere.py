"""An engine whose ranks run elsewhere: a Python that has torch and cannot import hora, nor the
driver's modules (tests/_nohora.py), as a cluster's node where nothing but torch was installed.

The toy launcher, written against `hora.engines` alone, ships hora to its ranks (`hora_zip` on
their PYTHONPATH) and says its ranks run `ELSEWHERE`, so the job's own module (this one) goes by
value; the ranks then run a real two-rank allreduce through hora.torch, imported from the zip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import hora
from hora import engines
from hora.engines import (
    AttemptSpec,
    Capabilities,
    Engine,
    LaunchContext,
    Launcher,
    RanksRun,
    WorkerProcess,
)
from tests._nohora import make_python_without_hora

LOOPBACK = "127.0.0.1"


class ElsewhereLauncher(Launcher):
    """Each rank a process of `python`, an interpreter that finds neither hora nor the driver's
    folders: hora goes as a zip on the ranks' PYTHONPATH."""

    # the driver's modules cannot be imported there: they go by value
    capabilities = Capabilities(ranks_run=RanksRun.ELSEWHERE)
    python = ""  # set by the test: the interpreter of the "other machine"

    def __init__(self, spec: AttemptSpec) -> None:
        if not self.python:
            raise ValueError("the elsewhere engine needs ElsewhereLauncher.python")
        self.spec = spec
        self.workers: list[WorkerProcess] = []
        self.store: object = None

    def start(self, ctx: LaunchContext) -> None:
        self.store, port = engines.host_store(LOOPBACK)
        # what a cluster engine hands its nodes, unless ship_code=False (hora installed there)
        ships = engines.ships(self.spec.ship_code, needed=True)
        shipped = engines.hora_zip() if ships else ""
        for place in engines.placements([LOOPBACK] * self.spec.np):
            env = engines.worker_env(place, LOOPBACK, port, user_env=self.spec.env)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (shipped, env.get("PYTHONPATH")) if p)
            # the driver's folders are not on the other machine: the rank imports from the zip
            boot = ctx.boot(place.rank)._replace(sys_path=())
            self.workers.append(_process(ctx, boot, env, self.python))

    def stop(self) -> None:
        engines.stop_all(self.workers, 3.0)
        self.workers, self.store = [], None


def _process(
    ctx: LaunchContext, boot: engines.Boot, env: dict[str, str], python: str
) -> WorkerProcess:
    rank = boot.rank
    return WorkerProcess(
        boot,
        env,
        on_line=lambda stream, line: ctx.report(engines.Output(rank, stream, line)),
        on_exit=lambda code: ctx.report(engines.Exited(rank, code)),
        python=python,
    )


ELSEWHERE = Engine(
    name="elsewhere",
    is_active=lambda: False,
    launcher=f"{__name__}:ElsewhereLauncher",
    summary="a test's engine whose ranks cannot import hora",
)


def allreduce_with_shipped_hora() -> tuple[float, str, bool]:
    """Runs in a rank: hora.torch from the shipped zip, and this function by value."""
    import importlib.util

    import torch

    import hora.torch as hvd

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), name="sum", op=hvd.Sum)
    where = hvd.__file__
    hvd.shutdown()
    return total.item(), where, importlib.util.find_spec("tests") is None


@pytest.fixture
def elsewhere(tmp_path: Path) -> Iterator[Engine]:
    ElsewhereLauncher.python = make_python_without_hora(tmp_path / "no-hora")
    engines.register(ELSEWHERE)
    try:
        yield ELSEWHERE
    finally:
        engines.unregister(ELSEWHERE.name)
        ElsewhereLauncher.python = ""


def test_ranks_that_cannot_import_hora_run_a_shipped_allreduce(elsewhere):
    results = hora.run(allreduce_with_shipped_hora, np=2, backend="elsewhere")
    assert [total for total, _, _ in results] == [3.0, 3.0]  # 1 + 2, on both ranks
    for _, where, no_tests in results:
        shipped = where.split(os.sep + "hora" + os.sep)[0]
        assert shipped.endswith(".zip") and os.path.basename(shipped).startswith("hora-"), where
        assert no_tests  # the job's module came by value: the rank cannot import it


def test_ship_code_false_ships_nothing_where_nothing_is_installed(elsewhere):
    """`ship_code=False`: hora and the job's module must be installed where the ranks run."""
    with pytest.raises(hora.WorkerFailedError, match="No module named 'hora'"):
        hora.run(allreduce_with_shipped_hora, np=2, backend="elsewhere", ship_code=False)
