"""The job's world (`hora.job.world`): every event in every state, and random sequences of
events against its invariants (ranks 0..n-1 without gaps, survivors keep their process and
order, no world below min_np, no decision that drops a running rank that is not lost)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hora.job.state import AttemptState
from hora.job.world import (
    Abandon,
    Loss,
    ReformWorld,
    Restart,
    StartJoiners,
    World,
)


def running(np: int = 4, min_np: int = 2, in_place: bool = True) -> World:
    world = World(np, min_np, in_place)
    for pid in range(np):
        assert world.started(pid, f"h{pid % 2}") == pid
        world.said(pid, able=True, grows=True)
    assert world.phase is AttemptState.RUNNING
    return world


def growing(world: World, size: int) -> StartJoiners:
    start = world.grow(size, can_add=True, now=0.0, wait=60.0)
    assert isinstance(start, StartJoiners)
    for pid, _rank in start.joiners:
        world.started(pid, "h9")
    return start


def test_the_world_starts_until_every_rank_said_whether_it_can_re_form():
    world = World(3, 2, in_place=True)
    world.said(0, able=True, grows=True)
    world.said(1, able=False, grows=False)
    assert world.phase is AttemptState.STARTING
    world.said(2, able=True, grows=True)
    assert world.phase is AttemptState.RUNNING


def test_a_rank_lost_while_the_first_world_gathers_leaves_a_smaller_one_gathering():
    """No rank is past the rendezvous: the survivors, waiting there, hear of a smaller world."""
    world = World(4, 2, in_place=True)
    world.started(0, "h0")
    [order] = world.lose([Loss(2, gone=True)], 0.0, "rank 2 failed")
    assert isinstance(order, ReformWorld) and not order.grow
    assert (order.members, order.generation, order.before) == ((0, 1, 3), 1, 4)
    assert (world.phase, world.pending, world.size) == (AttemptState.STARTING, None, 3)
    assert world.started(3, "h1") == 2  # a survivor that says hello later has its new rank
    for pid in (0, 1, 3):
        world.said(pid, able=True, grows=True)
    assert world.phase is AttemptState.RUNNING


def test_a_rank_lost_once_a_rank_is_past_the_first_rendezvous_restarts_every_rank():
    world = World(3, 2, in_place=True)
    world.gathered(1, 0)
    assert world.lose([Loss(2, gone=True)], 0.0, "rank 2 failed") == [Restart("rank 2 failed")]
    assert world.phase is AttemptState.FAILING
    world = World(3, 2, in_place=True)
    world.gathered(2, 0)  # the lost rank itself was past it: so may the others be
    assert world.lose([Loss(2, gone=True)], 0.0, "x") == [Restart("x")]


def test_a_rank_lost_before_it_said_it_can_re_form_leaves_survivors_that_said_so_in_place():
    """Every survivor's hvd.elastic.run said it can re-form (it is in its loop, past its start):
    only the lost rank had not, so the survivors re-form; one survivor that had not yet: restart."""
    world = World(3, 2, in_place=True)
    for pid in (0, 1):
        world.gathered(pid, 0)
        world.said(pid, able=True, grows=True)
    assert world.phase is AttemptState.STARTING
    [order] = world.lose([Loss(2, gone=True)], 0.0, "rank 2 failed")
    assert isinstance(order, ReformWorld) and not order.grow
    assert (order.members, order.generation, world.phase) == ((0, 1), 1, AttemptState.SHRINKING)
    assert world.reformed(1) is not None and world.phase is AttemptState.RUNNING
    world = World(3, 2, in_place=True)
    world.gathered(0, 0)
    world.said(0, able=True, grows=True)
    assert world.lose([Loss(2, gone=True)], 0.0, "x") == [Restart("x")]


def test_a_world_ordered_that_does_not_go_on_in_time_restarts():
    world = running(3, 2)
    world.confirm_wait = 10.0
    world.lose([Loss(2, gone=True)], 100.0, "lost")
    assert world.late(now=0.0, wall=105.0) is None
    late = world.late(now=0.0, wall=111.0)
    assert isinstance(late, Restart) and "did not go on within 10 s" in late.why
    assert world.phase is AttemptState.FAILING


@pytest.mark.parametrize("lost", [[0], [1], [3], [0, 3], [1, 2]])
def test_lost_ranks_survivors_re_form_in_their_order_and_keep_their_processes(lost):
    world = running(4, 2)
    [order] = world.lose([Loss(r, gone=True) for r in lost], 5.0, "lost")
    assert isinstance(order, ReformWorld) and not order.grow
    survivors = tuple(p for p in range(4) if p not in lost)
    assert order.members == order.running == survivors
    assert order.before == 4  # each survivor's new rank is its place in `members`
    assert (order.generation, world.phase) == (1, AttemptState.SHRINKING)
    assert [world.rank_of(p) for p in survivors] == list(range(len(survivors)))
    assert all(world.rank_of(p) is None for p in lost)
    assert world.reformed(0) is None  # an older world's word
    assert world.reformed(1) == (4, "lost", 5.0)
    assert world.phase is AttemptState.RUNNING


@pytest.mark.parametrize(
    "losses",
    [
        [Loss(1, gone=True), Loss(2, gone=True), Loss(3, gone=True)],  # 1 left of min_np=2
        [Loss(1, gone=True, own=True)],  # the job's own exception: it would fail again
        [Loss(1, gone=False)],  # only silent: it may live on
    ],
)
def test_what_cannot_re_form_restarts(losses):
    world = running(4, 2)
    assert world.lose(losses, 0.0, "why") == [Restart("why")]


def test_a_world_that_never_re_forms_restarts_on_any_loss():
    world = running(2, in_place=False)
    assert world.lose([Loss(1, gone=True)], 0.0, "x") == [Restart("x")]
    assert world.grow(4, can_add=True, now=0, wait=1) is None


def test_a_survivor_that_cannot_re_form_restarts():
    world = World(3, 2, in_place=True)
    for pid in range(3):
        world.said(pid, able=pid != 0, grows=True)
    assert world.lose([Loss(2, gone=True)], 0.0, "x") == [Restart("x")]


def test_a_rank_lost_while_the_survivors_re_form_gives_a_newer_world():
    world = running(4, 2)
    world.lose([Loss(3, gone=True)], 0.0, "first")
    [order] = world.lose([Loss(0, gone=True)], 1.0, "second")
    assert isinstance(order, ReformWorld)
    assert (order.members, order.generation, order.before) == ((1, 2), 2, 3)
    assert world.reformed(1) is None and world.reformed(2) is not None


def test_a_growth_starts_new_ranks_then_re_forms_every_rank_with_them():
    world = running(2, 1)
    start = growing(world, 4)
    assert start.joiners == ((2, 2), (3, 3)) and start.running == (0, 1)
    assert (start.generation, world.phase) == (1, AttemptState.GROWING)
    assert world.rank_of(3) == 3 and world.size == 2
    assert world.joined(2, 1.0) is None  # not every new rank waits yet
    order = world.joined(3, 1.0)
    assert isinstance(order, ReformWorld) and order.grow
    assert (order.members, order.running, order.generation) == ((0, 1, 2, 3), (0, 1), 1)
    assert order.hosts == ("h0", "h1", "h9", "h9")
    assert world.reformed(1) is not None
    assert (world.phase, world.size, world.joiners) == (AttemptState.RUNNING, 4, [])


def test_a_growth_is_refused_where_a_rank_cannot_grow_or_the_engine_cannot_add():
    world = running(2, 1)
    assert world.grow(3, can_add=False, now=0, wait=1) is None
    assert world.grow(2, can_add=True, now=0, wait=1) is None  # no larger
    world.said(1, able=True, grows=False)
    assert world.grow(3, can_add=True, now=0, wait=1) is None
    assert world.phase is AttemptState.RUNNING and world.generation == 0


def test_a_new_rank_lost_before_it_waits_gives_the_growth_up_and_the_running_ranks_go_on():
    world = running(2, 1)
    growing(world, 4)
    [abandon] = world.lose([Loss(3, gone=True)], 2.0, "rank 3 failed")
    assert isinstance(abandon, Abandon)
    assert (abandon.ids, abandon.ranks) == ((2, 3), (2, 3))
    assert (world.phase, world.members, world.size) == (AttemptState.RUNNING, [0, 1], 2)
    assert world.rank_of(2) is None and world.started(2, "h9") is None  # ends itself
    again = growing(world, 3)  # a later growth: new ids, a newer world
    assert again.joiners == ((4, 2),) and again.generation == 2


def test_new_ranks_that_are_late_give_the_growth_up():
    world = running(2, 1)
    growing(world, 3)
    assert world.late(now=59.0) is None
    abandon = world.late(now=61.0)
    assert isinstance(abandon, Abandon) and abandon.ids == (2,)
    assert world.phase is AttemptState.RUNNING


def test_a_running_rank_lost_while_new_ranks_start_shrinks_without_them():
    world = running(3, 2)
    growing(world, 4)
    abandon, order = world.lose([Loss(0, gone=True)], 3.0, "rank 0 failed")
    assert isinstance(abandon, Abandon) and abandon.ids == (3,)
    assert isinstance(order, ReformWorld) and not order.grow
    assert (order.members, order.generation, order.before) == ((1, 2), 2, 3)


def test_a_new_rank_lost_after_the_running_ranks_were_told_re_forms_them_alone():
    world = running(2, 1)
    growing(world, 4)
    world.joined(2, 1.0)
    world.joined(3, 1.0)
    abandon, order = world.lose([Loss(3, gone=True)], 3.0, "rank 3 failed")
    assert isinstance(abandon, Abandon) and abandon.ranks == (2, 3)
    assert isinstance(order, ReformWorld) and not order.grow
    assert (order.members, order.generation, order.before) == ((0, 1), 2, 2)
    assert world.reformed(1) is None  # the given-up world's rank 0 is not heard
    assert world.reformed(2) is not None and world.size == 2


def test_a_running_rank_lost_during_a_growth_re_forms_the_survivor_with_the_new_ranks():
    # issue 47: 1 survivor < min_np, but with the 2 new ranks 3 >= min_np: no restart
    world = running(2, 2)
    growing(world, 4)
    [order] = world.lose([Loss(1, gone=True)], 3.0, "rank 1 failed")
    assert isinstance(order, ReformWorld) and not order.grow  # every rank re-forms now
    assert (order.members, order.generation, order.before) == ((0, 2, 3), 2, 2)
    assert order.hosts == ("h0", "h9", "h9")
    assert world.phase is AttemptState.SHRINKING and world.joiners == []
    assert (world.rank_of(0), world.rank_of(1), world.rank_of(2)) == (0, None, 1)
    assert world.joined(2, 4.0) is None  # the older world's word: nothing more to do
    assert world.reformed(1) is None
    assert world.reformed(2) == (2, "rank 1 failed; the survivors re-form with the new ranks", 3.0)
    assert (world.phase, world.size) == (AttemptState.RUNNING, 3)


def test_a_running_rank_lost_after_the_running_ranks_were_told_re_forms_with_the_new_ranks():
    world = running(2, 2)
    growing(world, 4)
    world.joined(2, 1.0)
    grow = world.joined(3, 1.0)
    assert isinstance(grow, ReformWorld) and grow.grow
    [order] = world.lose([Loss(0, gone=True)], 3.0, "rank 0 failed")
    assert isinstance(order, ReformWorld) and not order.grow
    assert (order.members, order.generation, order.before) == ((1, 2, 3), 2, 2)
    assert world.reformed(1) is None and world.reformed(2) is not None


def test_the_new_ranks_hosts_unknown_the_survivor_waits_for_one_to_reach_the_rendezvous():
    world = running(2, 2)
    start = world.grow(4, can_add=True, now=0.0, wait=60.0)  # no new rank said hello yet
    assert isinstance(start, StartJoiners)
    assert world.lose([Loss(0, gone=True)], 3.0, "rank 0 failed") == []
    assert world.size == 1 and world.rank_of(0) is None  # the lost rank's records go
    world.started(2, "h1")
    assert world.joined(2, 4.0) is None  # rank 3's host is not known yet
    world.started(3, "h9")
    order = world.joined(3, 5.0)
    assert isinstance(order, ReformWorld) and not order.grow
    assert (order.members, order.hosts, order.before) == ((1, 2, 3), ("h1", "h1", "h9"), 2)
    assert world.pending is not None and world.pending[3] == 3.0  # timed from the loss


@pytest.mark.parametrize("then", ["late", "another loss"])
def test_waiting_survivors_restart_when_the_new_ranks_fail_them(then):
    world = running(2, 2)
    world.grow(4, can_add=True, now=0.0, wait=60.0)
    assert world.lose([Loss(1, gone=True)], 3.0, "rank 1 failed") == []
    if then == "late":
        decision = world.late(now=61.0)
    else:
        [decision] = world.lose([Loss(2, gone=True)], 4.0, "rank 3 failed")
    assert isinstance(decision, Restart) and world.phase is AttemptState.FAILING


@pytest.mark.parametrize(
    "np,min_np,lost",
    [
        (2, 2, [Loss(0, gone=True), Loss(1, gone=True)]),  # no survivor: no commit to go on from
        (3, 3, [Loss(0, gone=True), Loss(1, gone=True)]),  # 1 + 1 new rank < min_np
        (2, 2, [Loss(1, gone=False)]),  # only silent: it may live on
        (2, 2, [Loss(1, gone=True, own=True)]),  # its own exception
        (2, 2, [Loss(1, gone=True), Loss(2, gone=True)]),  # a new rank lost too
    ],
)
def test_a_running_rank_lost_during_a_growth_still_restarts_where_it_must(np, min_np, lost):
    world = running(np, min_np)
    growing(world, np + 1 if min_np == 3 else 4)
    decisions = world.lose(lost, 3.0, "lost")
    assert isinstance(decisions[-1], Restart)


# -- random sequences ------------------------------------------------------------------------
event = st.one_of(
    st.tuples(st.just("lose"), st.lists(st.integers(0, 7), min_size=1, max_size=3), st.booleans()),
    st.tuples(st.just("grow"), st.integers(1, 8)),
    st.tuples(st.just("join"), st.integers(0, 7)),
    st.tuples(st.just("hello"), st.integers(0, 7)),
    st.tuples(st.just("reformed")),
    st.tuples(st.just("late")),
)


def _apply(world: World, kind: str, args: list, clock: int, used: set[int]) -> tuple[list, set]:
    """One event on the world: its decisions, and the processes it was told were lost."""
    if kind == "lose":
        everyone = world.size + len([j for j in world.joiners if j not in world.members])
        ranks = sorted({r % everyone for r in args[0]})
        losses = [Loss(r, gone=args[1] or r % 2 == 0) for r in ranks]
        lost = {world.id_of(r) for r in ranks}
        running = set(world.members) - set(world.joiners)
        regroup = world.joiners and world.regroup is None and lost <= running
        decisions = world.lose(losses, float(clock), "lost")
        if any(isinstance(d, Restart) for d in decisions):
            survivors = set(world.members) - lost
            could_re_form = len(survivors) >= world.min_np and all(loss.gone for loss in losses)
            assert not (world.in_place and could_re_form), "a restart while it could re-form"
            left = len(running - lost)  # with the new ranks, enough to re-form
            could_regroup = regroup and left > 0 and left + len(world.joiners) >= world.min_np
            assert not (world.in_place and could_regroup and all(loss.gone for loss in losses))
        return decisions, lost
    if kind == "grow":
        before = world.size
        start = world.grow(args[0], can_add=True, now=float(clock), wait=3.0)
        if start is None:
            return [], set()
        ids = {pid for pid, _ in start.joiners}
        assert not ids & used, "a process id used twice"
        used |= ids
        assert [r for _, r in start.joiners] == list(range(before, args[0]))
        return [start], set()
    decision = None
    if kind == "join" and world.joiners:
        pid = world.joiners[args[0] % len(world.joiners)]
        world.started(pid, "h9")  # a new rank says hello before it waits
        decision = world.joined(pid, float(clock))
    elif kind == "hello" and world.joiners:
        world.started(world.joiners[args[0] % len(world.joiners)], "h9")
    elif kind == "reformed" and world.pending is not None:
        world.reformed(world.pending[0])
    elif kind == "late":
        decision = world.late(float(clock))
    return ([decision] if decision is not None else []), set()


@settings(max_examples=300, deadline=None)
@given(
    np=st.integers(1, 6),
    min_np=st.integers(1, 4),
    in_place=st.booleans(),
    events=st.lists(event, max_size=25),
)
def test_random_events_keep_the_world_whole(np, min_np, in_place, events):
    world = running(np, min_np, in_place)
    used: set[int] = set(range(np))
    generation = 0
    for clock, (kind, *args) in enumerate(events):
        before, joiners = list(world.members), list(world.joiners)
        decisions, lost = _apply(world, kind, args, clock, used)
        if any(isinstance(d, Restart) for d in decisions):
            assert world.phase is AttemptState.FAILING
            return
        for decision in decisions:
            # a world that may not re-form in place only ever restarts
            assert in_place or not isinstance(decision, ReformWorld | StartJoiners)
            if isinstance(decision, ReformWorld):
                assert decision.generation > generation
                generation = decision.generation
                # (np < min_np, which hora.run refuses, starts below min_np: as the size's)
                assert len(decision.members) >= (1 if decision.grow else min(min_np, np))
                assert set(decision.members) <= set(before) | set(joiners)
            if isinstance(decision, Abandon):
                assert set(decision.ids) == set(joiners)
        # ranks 0..n-1 without gaps, in the order the processes had
        assert [world.rank_of(p) for p in world.members] == list(range(world.size))
        if world.regroup is None:
            assert world.size >= min(min_np, np)
        else:  # the survivors of a loss during a growth wait for its new ranks
            assert 0 < world.size < min_np <= world.size + len(world.joiners)
        kept = [p for p in before if p in world.members]
        assert kept == sorted(kept, key=before.index)
        # survivors keep their process: only the lost (and new ranks given up) leave
        assert set(before) - set(world.members) <= (lost & set(before)) | set(joiners)
        assert not lost & set(world.members)
        assert not world.gone & (set(world.members) | set(world.joiners))
