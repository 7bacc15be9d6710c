"""The negotiation tree: its shape, each rank's relay, and whole worlds of real rounds in one
process (`_tree_world`), against the star (every rank a child of rank 0) as the reference."""

from __future__ import annotations

import contextlib
import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hora.collectives._common import SHUT_DOWN, HorovodInternalError
from hora.collectives._control.relay import HOLD_S, Relay
from hora.collectives._control.tree import FANOUT_VAR, NegotiationTree, fanout_from_env
from hora.collectives._messages import JOIN, JoinDone, Request
from tests.collectives._tree_world import TreeWorld, barrier, mismatched
from tests.collectives.test_rounds import join

# ----- the tree ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("size", "fanout"), [(1, 8), (9, 8), (10, 8), (64, 8), (1024, 8), (37, 3)])
def test_every_rank_but_0_has_one_parent_whose_children_it_is_among(size, fanout) -> None:
    tree = NegotiationTree(size, fanout)
    assert tree.parent(0) is None
    for rank in range(1, size):
        parent = tree.parent(rank)
        assert parent is not None and parent < rank and rank in tree.children(parent)
    assert sum(len(tree.children(r)) for r in range(size)) == size - 1
    assert max(len(tree.children(r)) for r in range(size)) <= fanout
    assert tree.subtree_size(0) == size == len(set(tree.subtree(0)))
    for rank in range(size):
        assert tree.subtree_size(rank) == len(tree.subtree(rank))


def test_a_small_world_is_the_star_and_a_large_one_is_shallow() -> None:
    assert NegotiationTree(9, 8).depth() == 1 and list(NegotiationTree(9, 8).children(0)) == [
        *range(1, 9)
    ]
    assert NegotiationTree(1024, 8).depth() == 4  # 1 + 8 + 64 + 512 < 1024 <= 1 + ... + 4096
    assert NegotiationTree(1023, 2).depth() == 9 and NegotiationTree(1024, 2).depth() == 10


def test_the_fanout_comes_from_the_environment_and_bad_values_are_named(monkeypatch) -> None:
    monkeypatch.delenv(FANOUT_VAR, raising=False)
    assert fanout_from_env() == 8
    monkeypatch.setenv(FANOUT_VAR, "3")
    assert fanout_from_env() == 3
    for bad in ("1", "two", "0"):
        monkeypatch.setenv(FANOUT_VAR, bad)
        with pytest.raises(ValueError, match=FANOUT_VAR):
            fanout_from_env()


# ----- a rank's relay ----------------------------------------------------------------------------
def _relay(rank: int = 1, children: tuple[int, ...] = (3, 4)) -> Relay:
    return Relay(rank, children, lambda cid: cid < 100)  # ids >= 100: another process set's


def test_a_leaf_reports_its_cached_round_for_its_whole_subtree_at_once() -> None:
    leaf = _relay(children=())
    leaf.own(2, [5, 6], now=0.0)
    assert leaf.take() == [(1, True, 2, (5, 6))] and not leaf.holding()


def test_ids_the_whole_subtree_sent_go_up_as_one_report_whatever_the_frames_and_order() -> None:
    relay = _relay()
    relay.child(3, (3, True, 1, (5, 6)), now=0.0)
    relay.own(2, [6], now=0.0)
    assert relay.take() == [] and relay.holding() and relay.due() == HOLD_S
    relay.child(4, (4, True, 3, (6, 5)), now=0.1)
    assert relay.take() == [(1, True, 1, (6,))]  # the fewest drops any of them applied
    relay.own(2, [5], now=0.1)  # this rank's second frame
    assert relay.take() == [(1, True, 1, (5,))] and not relay.holding()


def test_a_senders_ids_held_go_up_before_its_word_chosen_after_a_cache_drop() -> None:
    relay = _relay()
    relay.child(3, (3, True, 0, (5,)), now=0.0)
    relay.child(3, (3, True, 1, (6,)), now=0.0)  # it applied a CacheDrop since
    assert relay.take() == [(3, True, 0, (5,))] and relay.holding()  # 6 held, at drops 1
    relay.own(1, [6], now=0.0)
    relay.child(4, (4, True, 1, (6,)), now=0.0)
    assert relay.take() == [(1, True, 1, (6,))]


def test_anything_else_goes_up_at_once_after_what_was_held() -> None:
    relay = _relay()
    relay.child(3, (3, True, 0, (5, 6)), now=0.0)
    request = Request("x", "allreduce", 0, ("float32",), ((1,),), "cpu", 4)
    relay.child(3, (9, False, 0, [request]), now=0.0)  # a grandchild's own round, relayed
    assert relay.take() == [(3, True, 0, (5, 6)), (9, False, 0, [request])]


def test_another_process_sets_ids_and_a_join_below_are_never_held() -> None:
    relay = _relay()
    relay.own(0, [100, 5], now=0.0)  # 100: not the global set's
    assert relay.take() == [(1, False, 0, [100, 5])]
    relay.child(3, (3, False, 0, [JOIN]), now=0.0)
    relay.own(0, [5], now=0.0)
    assert relay.take() == [(3, False, 0, [JOIN]), (1, False, 0, [5])]  # not held while joined
    relay.heard([JoinDone(3)])
    relay.own(0, [7], now=0.0)
    assert relay.take() == [] and relay.holding()


def test_ids_held_too_long_go_up_and_their_late_senders_follow_without_waiting() -> None:
    relay = _relay()
    relay.own(0, [5, 6], now=10.0)
    relay.child(3, (3, True, 0, (5,)), now=10.0)
    relay.release(10.0 + HOLD_S / 2)
    assert relay.take() == []
    relay.release(10.0 + HOLD_S)  # child 4 is late: the stall inspector must see who
    assert relay.take() == [(1, False, 0, (5, 6)), (3, True, 0, (5,))]
    relay.child(4, (4, True, 0, (6, 5)), now=11.0)  # its share of those ids: up at once
    assert relay.take() == [(4, True, 0, (6, 5))] and not relay.holding()
    relay.child(3, (3, True, 0, (6,)), now=11.0)  # child 3 owed 6 only
    relay.child(3, (3, True, 0, (5,)), now=12.0)  # the next step's 5 is held again
    assert relay.take() == [(3, True, 0, (6,))] and relay.holding()


# ----- whole worlds ------------------------------------------------------------------------------
def _step(world: TreeWorld, names: list[str], rng: random.Random | None = None) -> list:
    ops = []
    for side in world.ranks:
        mine = [barrier(n) for n in names]
        if rng is not None:
            rng.shuffle(mine)
        ops += side.submit(mine)
    assert world.pump(ops, rng), "the step did not complete"
    return ops


@pytest.fixture
def world():
    worlds: list[TreeWorld] = []

    def make(size: int, fanout: int, **kw) -> TreeWorld:
        worlds.append(TreeWorld(size, fanout, **kw))
        return worlds[-1]

    yield make
    for w in worlds:
        w.close()


def test_a_repeated_step_reaches_rank_0_as_one_report_per_child(world) -> None:
    w = world(13, 3)  # rank 0 -> 1..3; 1 -> 4..6; 2 -> 7..9; 3 -> 10..12
    names = [f"grad.{k}" for k in range(8)]
    _step(w, names)  # first time: every request matched by name, then cached
    root = w.ranks[0].round
    heard = root.reports_heard
    for _ in range(5):
        ops = _step(w, names)
        assert all(op.done and op.error is None for op in ops)
    assert root.coordinator.repeated_rounds == 5
    assert root.reports_heard - heard == 5 * 3  # each child's whole subtree, once a step
    assert len({tuple(side.ran) for side in w.ranks}) == 1  # every rank ran the same, in order


def test_a_late_leaf_costs_its_subtree_one_hold_and_the_step_completes(world) -> None:
    w = world(7, 2, hold_s=HOLD_S / 4)  # rank 0 -> 1, 2; 1 -> 3, 4; 2 -> 5, 6
    names = ["a", "b"]
    _step(w, names)
    late = w.ranks[6]
    ops = []
    for side in w.ranks:
        if side is not late:
            ops += side.submit([barrier(n) for n in names])
    assert not w.pump(ops, seconds=HOLD_S / 4 * 1.5)  # rank 6's round is not in yet
    assert w.ranks[0].round.coordinator.pending  # past the hold: rank 0 matches one by one
    ops += late.submit([barrier(n) for n in names])
    assert w.pump(ops)
    assert len({tuple(side.ran) for side in w.ranks}) == 1
    _step(w, names)  # the next steps fold again
    assert w.ranks[0].round.coordinator.repeated_rounds >= 1


def test_a_process_set_round_is_not_held_for_ranks_outside_the_set(world) -> None:
    w = world(7, 2, sets={1: (3, 4)})  # both leaves under rank 1
    for _ in range(3):
        ops = [w.ranks[r].submit([barrier("ps.x", process_set=1)])[0] for r in (3, 4)]
        began = time.monotonic()
        assert w.pump(ops)
        assert not any(side.round.relay.holding() for side in w.ranks[1:])
    assert time.monotonic() - began < HOLD_S  # never held: no rank of the set waited for others


def test_join_with_the_tree_completes_for_every_rank(world) -> None:
    w = world(5, 2)
    _step(w, ["x"])
    joins = [side.submit([barrier("x")]) for side in w.ranks[:3]]  # ranks 3, 4 have run out
    joiners = [w.ranks[r].submit([join()])[0] for r in (3, 4)]
    assert w.pump([op for ops in joins for op in ops])
    late = [w.ranks[r].submit([join()])[0] for r in (0, 1, 2)]
    assert w.pump(joiners + late)
    assert {op.result for op in joiners + late} == {2}  # rank 2 joined last


def test_a_lost_interior_rank_stops_every_rank_naming_it(world) -> None:
    w = world(7, 2)
    _step(w, ["x"])
    pending = [side.submit([barrier("y")])[0] for side in w.ranks if side.rank != 1]
    w.ranks[1].round.close()  # rank 1's process is gone: its parent and children see it
    w.ranks[1].sel.close()
    running = [side for side in w.ranks if side.rank != 1]
    lost_parent: dict[int, str] = {}
    deadline = time.monotonic() + 10
    while running and time.monotonic() < deadline:
        for side in list(running):
            try:
                side.step(0.001)
            except ConnectionError as exc:  # as the collective loop's crash does
                lost_parent[side.rank] = str(exc)
                reason = f"{SHUT_DOWN} (ConnectionError: {exc})"
                side.queue.fail_all(reason)
                with contextlib.suppress(OSError):
                    side.round.tell_peers(reason)
            if side.round.ended or side.rank in lost_parent:
                running.remove(side)
    assert all(isinstance(op.error, HorovodInternalError) for op in pending)
    told = {side.rank: side.queue.error for side in w.ranks if side.rank != 1}
    assert told[0] == told[2] == told[5] == told[6] == f"{SHUT_DOWN} (rank 1 disconnected)"
    assert set(lost_parent) == {3, 4}  # rank 1's children: their parent is gone
    assert "rank 1, its parent in the negotiation tree" in lost_parent[3]
    w.ranks[1].round = _Closed()


class _Closed:
    def close(self) -> None:
        pass


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    size=st.integers(2, 12),
    fanout=st.integers(2, 4),
    names=st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=6, unique=True),
    steps=st.integers(1, 4),
    with_set=st.booleans(),
    bad_step=st.integers(-1, 3),
    capacity=st.sampled_from([2, 64]),
    seed=st.integers(0, 2**16),
)
def test_every_rank_agrees_on_what_the_star_agrees_on(
    world, size, fanout, names, steps, with_set, bad_step, capacity, seed
) -> None:
    """Random submission orders, frames and step orders; an operation of a process set, a
    mismatch now and then, a response cache too small for a step (ids evicted and dropped while
    ranks still send them): the tree's world and the star's run the same operations and fail
    the same ones, and every rank of each runs them in one order."""
    members = tuple(range(0, size, 2))
    sets = {1: members} if with_set else {}
    worlds = {
        "tree": world(size, fanout, sets=sets, cache_capacity=capacity),
        "star": world(size, size, sets=sets, cache_capacity=capacity),
    }
    outcome = {}
    for kind, w in worlds.items():
        rng = random.Random(seed)
        done: list[set[str]] = []
        for step in range(steps):
            ops = []
            for side in w.ranks:
                mine = [barrier(f"{n}") for n in names]
                if with_set and side.rank in members:
                    mine.append(barrier("ps", process_set=1))
                if step == bad_step:
                    mine.append(mismatched("bad", side.rank))
                rng.shuffle(mine)
                cut = rng.randint(0, len(mine))
                ops += side.submit(mine[:cut], flush=True)
                side.step()
                ops += side.submit(mine[cut:], flush=True)
            assert w.pump(ops, rng), f"{kind}: step {step} did not complete"
            done.append({op.request.name for op in ops if op.error is None})
            failed = {op.request.name for op in ops if op.error is not None}
            assert failed == ({"bad"} if step == bad_step else set()), kind
        assert len({tuple(side.ran) for side in w.ranks if side.rank in members}) == 1, kind
        assert len({tuple(x for x in side.ran if "ps" not in x) for side in w.ranks}) == 1, kind
        outcome[kind] = done
    assert outcome["tree"] == outcome["star"]
