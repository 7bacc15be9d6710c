"""A third party's engine, registered from a test (no edit of hora), runs a real job.

The toy engine (tests/engines/_toy.py, written against `hora.engines` alone) starts each rank as
a process of this machine, as the local engine does, but through its own launcher and with its
own rank-side setup, which the worker runs before the job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

import hora
from hora import engines
from hora.engines import Engine
from hora.errors import WorkerFailedError
from tests.engines._toy import TOY, ToyLauncher, what_the_rank_sees


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
    failing = dataclasses.replace(TOY, rank_setup="tests.engines._toy:failing_rank_setup")
    engines.register(failing, override=True)
    with pytest.raises(WorkerFailedError, match="the toy engine could not set up rank"):
        hora.run(what_the_rank_sees, np=2, backend="toy")


def test_an_unregistered_engine_is_gone():
    with pytest.raises(ValueError, match=r"backend must be one of \('spark', 'ray', 'local'\)"):
        hora.run(what_the_rank_sees, np=2, backend="toy")
