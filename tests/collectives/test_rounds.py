"""Both sides of a negotiation round in one process: rank 0's CoordinatorRound and a worker's
WorkerRound joined by a socket pair and stepped by hand. Barriers and joins need no data path,
so no backend is involved; the engines' threads are not either."""

from __future__ import annotations

import selectors
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from hora.collectives._common import SHUT_DOWN, HorovodInternalError
from hora.collectives._control.coordinator_round import CoordinatorRound
from hora.collectives._control.negotiation import Coordinator
from hora.collectives._control.responses import ResponseHandler
from hora.collectives._control.stall import StallInspector, StallSettings
from hora.collectives._control.submissions import Op, SubmissionQueue
from hora.collectives._control.worker_round import WorkerRound
from hora.collectives._data.groups import GroupInfo
from hora.collectives._data.local_op import LocalOp
from hora.collectives._messages import BARRIER, STOP, ProcessSetChange, Request

WAIT_S = 5.0  # for a frame already sent by the other side


class Side:
    """One rank: its queue, its selector and its round."""

    def __init__(self, rank: int) -> None:
        self.queue = SubmissionQueue(cycle_time_s=0.0)  # every submission is due at once
        self.sel = selectors.DefaultSelector()
        self.sets = {0: GroupInfo(ranks=(0, 1), index=rank)}
        self.handler = ResponseHandler(self.queue, self.sets)
        self.round: Any = None

    def step(self, wait: float = 0.0) -> float | None:
        return self.round.step([key for key, _ in self.sel.select(wait)])


@pytest.fixture
def star() -> Iterator[tuple[Side, Side]]:
    a, b = socket.socketpair()
    rank0, rank1 = Side(0), Side(1)
    coord = Coordinator(2, 1 << 20, cache_capacity=8)
    coord.set_process_set(0, (0, 1))
    stall = StallInspector(StallSettings(enabled=False), coord)
    rank0.round = CoordinatorRound({1: a}, rank0.sel, rank0.queue, rank0.handler, coord, stall)
    rank1.round = WorkerRound(1, (0, b), {}, rank1.sel, rank1.queue, rank1.handler, rank1.sets, 5.0)
    yield rank0, rank1
    for side in (rank0, rank1):
        side.round.close()
        side.sel.close()


def barrier(name: str) -> Op:
    request = Request(name, BARRIER, 0, (), (), "cpu", 0)
    return Op(request, LocalOp([], False), lambda outputs: outputs)


def join() -> Op:
    return Op(None, LocalOp([], False), lambda outputs: outputs[0])


def one_round(rank0: Side, rank1: Side) -> None:
    """The worker sends, rank 0 decides and runs, the worker runs what rank 0 sent."""
    rank1.step()
    rank0.step(WAIT_S)
    rank1.step(WAIT_S)


def test_agreed_operations_complete_and_repeat_as_cache_ids(star) -> None:
    rank0, rank1 = star
    coord = rank0.round.coordinator
    for step in range(3):
        ops = {side: [barrier("b.x"), barrier("b.y")] for side in star}
        for side, mine in ops.items():
            for op in mine:
                side.queue.push(op, flush=False)
        one_round(rank0, rank1)
        assert all(op.done and op.error is None for mine in ops.values() for op in mine), step
        assert rank0.queue.inflight == {} and rank1.queue.inflight == {}
    assert set(rank1.round.cache.ids) == {(0, "b.x"), (0, "b.y")}
    # steps 2 and 3: rank 1 sent ids, and both rounds were answered from one plan
    assert coord.cached_submissions == 4 and coord.repeated_rounds == 2


def test_every_rank_joins_and_learns_the_last_one(star) -> None:
    rank0, rank1 = star
    ops = [join(), join()]
    rank1.queue.push(ops[1], flush=False)
    rank1.step()
    rank0.step(WAIT_S)  # rank 1 has joined, rank 0 not yet
    assert not ops[1].done and list(rank0.round.coordinator.joined) == [1]
    rank0.queue.push(ops[0], flush=False)
    rank0.step()
    rank1.step(WAIT_S)
    assert [op.result for op in ops] == [0, 0]  # rank 0 joined last


def test_a_workers_stop_ends_every_rank_and_fails_what_is_pending(star) -> None:
    rank0, rank1 = star
    pending = barrier("b.never")
    rank0.queue.push(pending, flush=False)
    rank1.queue.push_control(STOP, flush=True)
    assert rank1.step() == 0.5  # sent: it now waits for rank 0 to acknowledge
    assert rank0.step(WAIT_S) is None and rank0.round.ended
    assert rank1.step(WAIT_S) is None and rank1.round.ended
    assert rank0.queue.error == rank1.queue.error == SHUT_DOWN
    assert isinstance(pending.error, HorovodInternalError)
    with pytest.raises(HorovodInternalError):
        rank1.queue.push(barrier("b.later"), flush=False)


def test_a_failed_worker_stops_every_rank_with_its_reason(star) -> None:
    rank0, rank1 = star
    rank1.round.tell_peers("rank 1 broke")
    rank0.step(WAIT_S)
    rank1.step(WAIT_S)
    assert rank0.queue.error == rank1.queue.error == "rank 1 broke"


def test_a_process_set_change_reaches_rank_0s_coordinator_in_order(star) -> None:
    rank0, rank1 = star
    for side in star:  # every rank registers the set; only rank 0's coordinator keeps sets
        side.queue.push_control(ProcessSetChange(1, (0, 1)))
        side.sets[1] = GroupInfo(ranks=(0, 1), index=side.sets[0].index)
    rank0.step()  # as `register`'s barrier does, before any rank uses the set
    assert rank0.round.coordinator.members[1] == (0, 1)
    ops = {
        side: Op(Request("b.set", BARRIER, 1, (), (), "cpu", 0), LocalOp([], False), list)
        for side in star
    }
    for side, op in ops.items():
        side.queue.push(op, flush=False)
    one_round(rank0, rank1)  # rank 1's frame would not unpickle had it carried the change
    assert all(op.done and op.error is None for op in ops.values())
