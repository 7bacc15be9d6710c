"""hora's real driver against 256 simulated ranks (tests/scale/_driver_sim.py): every rank gets
its job and gathers through hora's store barrier at a constant cost, a rank whose process exits
is named and its survivors re-form a world of 255 in place, each in its new place, and a rank
that goes silent is named once the heartbeat timeout has passed. No timing is asserted here:
bench/scale.py reports the figures."""

from __future__ import annotations

import pytest

from hora.errors import WorkerFailedError
from tests.scale._driver_sim import Simulation

N = 256
#: the heartbeat timeout here: 3 s names a rank falsely while 256 simulated ranks share 2 cores
#: with other jobs (seen at a load of 40); a real rank beats from a thread of its own
SILENCE_S = 6.0


@pytest.fixture(scope="module")
def simulation() -> Simulation:
    return Simulation(N, steady_s=1.0, hang_timeout_s=SILENCE_S).run()


def test_every_rank_starts_and_gathers_at_a_constant_cost_in_the_store(simulation):
    ops = simulation.figures["store_ops_per_rank"]
    assert 3 <= ops <= 3 + 1 / N * 2, ops  # add, wait, get; the last to arrive one more


def test_an_exited_rank_is_named_and_its_survivors_re_form_each_in_its_new_place(simulation):
    gone = simulation.gone
    assert (
        f"resizing in place from {N} to {N - 1} ranks (rank {gone} failed: killed by "
        in (simulation.verdicts["exit"])
    )
    survivors = [ident for ident in range(N) if ident != gone]
    assert simulation.places == {ident: rank for rank, ident in enumerate(survivors)}


def test_a_silent_rank_is_named_and_ends_the_attempt(simulation):
    silent = simulation.silent
    assert f"rank {silent} on host sim" in simulation.verdicts["hang"]
    assert f"HORA_HEARTBEAT_TIMEOUT_SECONDS={SILENCE_S:g}" in simulation.verdicts["hang"]
    assert isinstance(simulation.error, WorkerFailedError)
    assert str(simulation.error).startswith(f"rank {silent} on host sim"), simulation.error
