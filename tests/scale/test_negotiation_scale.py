"""The negotiation at 256 ranks on this machine: rank 0's real collective loop facing 255
simulated ranks that run hora's own tree, relay and channel code (`_negotiation_sim`)."""

from __future__ import annotations

import pytest

from hora.collectives._control.stall import StallSettings
from hora.collectives._control.tree import NegotiationTree
from tests.scale import _negotiation_sim as sim

N = 256


def test_every_rank_runs_every_step_in_one_order_and_rank_0_hears_its_children_only() -> None:
    world = sim.world(N, fanout=8, steps=15)
    assert world.steps == 15 and world.agreed
    assert all(why is None or "shut down" in why for why in world.ended.values())
    # rank 0's share of a cached step is its 8 children's reports, whatever N is
    cost = sim.rank0_round_cost(N, 8, rounds=20)
    star = sim.rank0_round_cost(N, N - 1, rounds=20)
    assert cost["cached"] < star["cached"]  # not a timing claim: 8 reports against 255


@pytest.mark.parametrize("lost", [1, 200], ids=["interior-rank", "leaf"])
def test_a_simulated_ranks_exit_stops_every_rank_naming_it(lost: int) -> None:
    world = sim.world(N, fanout=8, steps=10, faults={"exit": {lost: 4}})
    assert world.steps == 3  # the 4th step never completes
    said = f"rank {lost} disconnected"
    assert world.rank0_error is not None and said in world.rank0_error
    survivors = {r: why for r, why in world.ended.items() if r != lost}
    below = set(NegotiationTree(N, 8).subtree(lost)) - {lost}
    for rank, why in survivors.items():
        assert why is not None, f"rank {rank} was never stopped"
        if rank in below:  # its parent is gone: its own loop stops, naming the parent
            assert "lost the connection" in why
        else:
            assert said in why, f"rank {rank}: {why}"


def test_a_hung_training_thread_is_named_by_rank_0s_stall_inspector() -> None:
    stall = StallSettings(check_s=1.0, shutdown_s=2.0)
    world = sim.world(N, fanout=8, steps=10, faults={"hang": {77: 3}}, stall=stall)
    assert world.steps == 2
    assert world.stalls and "missing on ranks [77]" in world.stalls[0]
    assert world.rank0_error is not None and "missing on ranks [77]" in world.rank0_error
    assert all(why is not None for r, why in world.ended.items() if r != 77)


def test_the_world_re_formed_without_one_rank_agrees_again() -> None:
    world = sim.world(N - 1, fanout=8, steps=5)  # a new tree over the N - 1 survivors
    assert world.steps == 5 and world.agreed
