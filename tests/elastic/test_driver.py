"""The elastic restart loop, read apart from processes: the driver driven by fake worker groups
and a fake cluster count, as tests/job drives the fixed-size loop."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import cloudpickle
import pytest

from hora import elastic, engines
from hora.config import ELASTIC_MAX_RESTARTS, RunConfig
from hora.engines import AttemptSpec, Capabilities
from hora.errors import WorkerFailedError
from hora.job.driver import Attempt, Job
from hora.job.elastic import SETTLE_ENV, FreeSlots, Sizer
from hora.wire import link
from hora.wire.protocol import (
    Exited,
    Hello,
    HostsUpdated,
    InPlace,
    Joining,
    Reform,
    Reformed,
    Resized,
    Result,
    Resumed,
    TimelineBatch,
)
from tests.job._fakes import FakeConnection, FakeGroup, hellos, sigkilled, succeeds


def drive(scripts, capacity, **config):
    """Run a Job of fake groups; returns (results, each group's (np, env))."""
    groups: list[tuple[int, FakeGroup]] = []

    def new_group(spec: AttemptSpec) -> FakeGroup:
        group = FakeGroup(scripts[spec.attempt](spec.np), dict(spec.env))
        groups.append((spec.np, group))
        return group

    count = lambda spec, held: capacity(held)  # noqa: E731
    job = Job(RunConfig(collect_all=True, **config), b"job", new_group, capacity=count)
    try:
        return job.run(), groups
    finally:
        assert all(g.stopped for _, g in groups)


@pytest.fixture(autouse=True)
def no_settle(monkeypatch):
    monkeypatch.setenv("HORA_ELASTIC_SETTLE_SECONDS", "0")


def resized(np: int) -> list[object]:
    return [*hellos(np), *(Resized(r, 7) for r in range(np)), *(Exited(r, 0) for r in range(np))]


def test_a_failure_shrinks_to_what_the_cluster_can_run_and_says_why(capfd):
    results, groups = drive(
        [lambda np: sigkilled(1) + hellos(4)[2:], succeeds],
        lambda held: 3,
        np=4,
        min_np=2,
        max_np=4,
    )
    assert [np for np, _ in groups] == [4, 3]
    assert results == ["value 0", "value 1", "value 2"]
    run_ids = {g.env["HORA_RUN_ID"] for _, g in groups}
    assert len(run_ids) == 1 and {g.env["HORA_ELASTIC"] for _, g in groups} == {"1"}
    assert [g.env["HORA_MAX_RESTARTS"] for _, g in groups] == [str(ELASTIC_MAX_RESTARTS)] * 2
    err = capfd.readouterr().err
    assert (
        "hora: resizing from 4 to 3 ranks (rank 1 failed: killed by signal 9 (SIGKILL)); "
        "the ranks resume from their last commit"
    ) in err, err
    assert "hora: attempt 2 of 11 starting (3 ranks)" in err, err


def test_never_more_than_max_np_and_below_min_np_it_waits_then_fails_with_the_story():
    _, groups = drive([lambda np: sigkilled(1), succeeds], lambda held: 9, np=2, min_np=1, max_np=3)
    assert [np for np, _ in groups] == [2, 3]
    with pytest.raises(WorkerFailedError) as info:
        drive([lambda np: sigkilled(1)], lambda held: 1, np=2, min_np=2, start_timeout=0.3)
    text = str(info.value)
    assert text.startswith(
        "the cluster could run 1 of min_np=2 ranks for 0 s after attempt 1 "
        "of 11 of 2 ranks ended (rank 1 failed: killed by signal 9"
    ), text
    assert "failed attempt 1: rank 1 failed: killed by signal 9 (SIGKILL)" in text


def test_every_rank_stopping_at_a_commit_starts_a_larger_attempt(capfd):
    results, groups = drive([resized, succeeds], lambda held: 4, np=2, min_np=2, max_np=4)
    assert [np for np, _ in groups] == [2, 4]
    assert len(results) == 4
    err = capfd.readouterr().err
    assert (
        "hora: resizing from 2 to 4 ranks (free slots for 4 ranks; every rank stopped at commit 7)"
    ) in err, err


def test_resizes_spend_the_restart_budget():
    with pytest.raises(WorkerFailedError, match="every attempt failed"):
        drive([lambda np: sigkilled(0)] * 3, lambda held: 2, np=2, min_np=1, max_restarts=1)


def test_the_growth_watch_asks_once_after_the_count_held_and_only_while_budget_is_left():
    counts = iter([2, 3, 2, 3, 3, 3, 3])
    watch = FreeSlots(2, lambda held: next(counts), steady=2.0, poll=1.0)
    due = [watch.due(t) for t in (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0)]
    assert due == [False, False, False, False, False, True, False]
    config = RunConfig(np=2, min_np=1, max_np=4, max_restarts=1)
    job = Job(config, b"", lambda spec: None, capacity=lambda spec, held: 4)  # type: ignore[arg-type]
    assert job._growth(Attempt(0, 1, 2)) is not None
    assert job._growth(Attempt(1, 1, 2)) is None  # no attempt left to grow into
    assert job._growth(Attempt(0, 1, 4)) is None  # already max_np


def test_the_growth_watch_skips_the_settle_time_while_the_engine_says_its_count_is_true():
    """`settled(held)`: the engine knows the lost ranks' slots free (`Launcher.slots_settled`);
    it is asked only once the count rose, and an error is a no (the settle time holds)."""
    asked: list[int] = []
    answers = iter([False, True])

    def settled(held: int) -> bool:
        asked.append(held)
        return next(answers)

    counts = iter([2, 3, 3])
    watch = FreeSlots(2, lambda held: next(counts), steady=60.0, poll=1.0, settled=settled)
    assert [watch.due(t) for t in (0.0, 1.0, 2.0, 3.0)] == [False, False, True, False]
    assert asked == [2, 2]

    def broken(held: int) -> bool:
        raise RuntimeError("the engine cannot say")

    watch = FreeSlots(2, lambda held: 3, steady=2.0, poll=1.0, settled=broken)
    assert [watch.due(t) for t in (0.0, 1.0, 2.0)] == [False, False, True]


def test_the_growth_watch_asks_the_group_whether_its_count_is_true_unless_the_user_set_it(
    monkeypatch,
):
    """HORA_ELASTIC_SETTLE_SECONDS, where set, is waited whatever the engine knows."""
    config = RunConfig(np=2, min_np=1, max_np=4, max_restarts=1)
    job = Job(config, b"", lambda spec: None, capacity=lambda spec, held: 4)  # type: ignore[arg-type]
    group = FakeGroup([], {})
    monkeypatch.delenv(SETTLE_ENV, raising=False)
    growth = job._growth(Attempt(0, 1, 2), group=group)
    assert growth is not None and growth.watch.settled == group.slots_settled
    monkeypatch.setenv(SETTLE_ENV, "1")
    growth = job._growth(Attempt(0, 1, 2), group=group)
    assert growth is not None and growth.watch.settled != group.slots_settled


def test_a_growth_s_next_attempt_waits_for_the_count_it_grew_for_up_to_the_settle_time():
    """Ray frees a stopped attempt's placement group a moment after its stop: the count right
    then is too low, and taking it would restart at the old size (and again, and again)."""
    now = [0.0]

    def sizer(counts: list[int]) -> Sizer:
        left = iter(counts)

        def sleep(seconds: float) -> None:
            now[0] += seconds

        return Sizer(1, 4, lambda held: next(left), settle=2.0, sleep=sleep, clock=lambda: now[0])

    assert sizer([2, 2, 4]).next_size(60.0, settle=False, want=3) == 4
    now[0] = 0.0
    assert sizer([2] * 10).next_size(60.0, settle=False, want=3) == 2  # not there: take it
    assert now[0] == pytest.approx(2.0, abs=1.0)
    assert sizer([3]).next_size(60.0, settle=False, want=3) == 3


class Growing(FakeGroup):
    """Two ranks that stop at commit 3 once the driver has told each of them HostsUpdated."""

    def start(self) -> None:
        self.started = True
        self.conns = [FakeConnection() for _ in range(2)]
        for rank, conn in enumerate(self.conns):
            self.events.put((conn, Hello(rank, 1000 + rank, "fakehost")))
        threading.Thread(target=self._answer, daemon=True).start()

    def _answer(self) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if all(HostsUpdated() in conn.sent for conn in self.conns):
                for rank in range(2):
                    self.events.put((None, Resized(rank, 3)))
                return
            time.sleep(0.02)


def test_the_driver_asks_the_ranks_to_stop_at_their_next_commit_when_slots_return():
    groups: list[FakeGroup] = []

    def new_group(spec: AttemptSpec) -> FakeGroup:
        group = Growing([], dict(spec.env)) if spec.attempt == 0 else FakeGroup(succeeds(4), {})
        groups.append(group)
        return group

    config = RunConfig(np=2, min_np=2, max_np=4, collect_all=True)
    results = Job(config, b"job", new_group, capacity=lambda spec, held: 4).run()
    assert len(results) == 4 and len(groups) == 2


def test_an_engine_that_cannot_count_its_slots_refuses_an_elastic_run(monkeypatch):
    real = engines.get
    monkeypatch.setattr(engines, "get", lambda name: dataclasses.replace(real(name), capacity=None))
    with pytest.raises(ValueError, match="the 'local' engine cannot count its free slots"):
        RunConfig(np=2, max_np=3)
    RunConfig(np=2)  # a fixed run needs no count


def test_the_timeline_marks_each_resize_and_the_commit_resumed_from(tmp_path):
    trace = tmp_path / "trace.json"
    batch: list[object] = [TimelineBatch(0, str(trace), [])]
    calls = []

    def capacity(held: int) -> int:
        calls.append(held)
        return 3 if len(calls) == 1 else 4  # after the failure, then when growing

    drive(
        [
            lambda np: batch + sigkilled(1) + hellos(4)[2:],
            lambda np: [*batch, Resumed(0, 5, 4), *resized(np)],
            lambda np: batch + succeeds(np),
        ],
        capacity,
        np=4,
        min_np=2,
        max_np=4,
    )
    events = json.loads(trace.read_text())
    marks = [(e["name"], e["args"]) for e in events if e.get("pid") == -1 and e["ph"] == "i"]
    assert [name for name, _ in marks] == ["resize", "resumed", "resize"], marks
    assert marks[0][1]["from"] == 4 and marks[0][1]["to"] == 3
    assert "killed by signal 9" in marks[0][1]["why"]
    assert marks[1][1] == {"commit": 5, "made_by": 4}
    assert (marks[2][1]["from"], marks[2][1]["to"], marks[2][1]["commit"]) == (3, 4, 7)


class GrowsInPlace(FakeGroup):
    """Two ranks of an engine that grows in place; `able`: what their hvd.elastic.run says.
    Added ranks say at once that they wait; once told (HostsUpdated naming world 1), rank 0
    says training went on at 3 ranks from commit 4, and all three return."""

    capabilities = Capabilities(reforms_in_place=True, grows_in_place=True)

    def __init__(self, able: bool) -> None:
        super().__init__([], {})
        self.able = able
        self.added: list[tuple[int, int]] = []
        self.running: list[int] = []
        self.add_env: dict[str, str] = {}

    def start(self) -> None:
        self.started = True
        self.conns = [FakeConnection() for _ in range(2)]
        for rank, conn in enumerate(self.conns):
            self.events.put((conn, Hello(rank, 1000 + rank, "fakehost")))
            self.events.put((conn, InPlace(rank, self.able, grows=self.able)))
        threading.Thread(target=self._answer, daemon=True).start()

    def add(self, joiners, running, env) -> None:
        self.added, self.running, self.add_env = list(joiners), list(running), dict(env)
        for ident, _ in joiners:  # on a host of its own: the engine's choice
            conn = FakeConnection()
            self.events.put((conn, Hello(ident, 1000 + ident, "newhost")))
            self.events.put((conn, Joining(ident)))

    def _answer(self) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if all(HostsUpdated(1) in conn.sent for conn in self.conns):
                self.events.put((None, Reformed(0, 1, 3, 4)))
                for ident in (0, 1, self.added[0][0]):
                    self.events.put((None, Result(ident, cloudpickle.dumps(f"value {ident}"))))
                    self.events.put((None, Exited(ident, 0)))
                return
            if all(HostsUpdated() in conn.sent for conn in self.conns):
                for rank in range(2):
                    self.events.put((None, Resized(rank, 3)))
                return
            time.sleep(0.02)


def test_ranks_that_can_re_form_grow_in_place_the_others_by_a_restart(tmp_path, capfd):
    trace = tmp_path / "trace.json"
    groups: list[FakeGroup] = []

    def new_group(spec: AttemptSpec) -> FakeGroup:
        group = GrowsInPlace(able=True) if spec.attempt == 0 else FakeGroup(succeeds(3), {})
        group.events.put((None, TimelineBatch(0, str(trace), [])))
        groups.append(group)
        return group

    config = RunConfig(np=2, min_np=2, max_np=3, collect_all=True)
    results = Job(config, b"job", new_group, capacity=lambda spec, held: 3).run()
    assert results == ["value 0", "value 1", "value 2"] and len(groups) == 1  # no restart
    first = groups[0]
    assert isinstance(first, GrowsInPlace)
    assert first.added == [(2, 2)] and first.running == [0, 1]  # (id, rank), running ids
    assert first.add_env == {"HORA_WORLD_GENERATION": "1"}
    for rank, conn in enumerate(first.conns):  # its place in the larger world, then the word
        orders = [m for m in conn.sent if isinstance(m, Reform)]
        # the new rank's host (its Hello's) counts: a second host in the world
        got = [(p.rank, p.size, p.local_size, p.cross_rank, p.cross_size) for p, _ in orders]
        assert got == [(rank, 3, 2, 0, 2)] and orders[0].generation == 1
        assert conn.sent.index(orders[0]) < conn.sent.index(HostsUpdated(1))
    err = capfd.readouterr().err
    assert (
        "hora: growing in place from 2 to 3 ranks (free slots for 3 ranks): starting rank 2; "
        "the running ranks keep their processes"
    ) in err, err
    assert "hora: resized in place from 2 to 3 ranks in " in err, err
    events = json.loads(trace.read_text())
    marks = [(e["name"], e["args"]) for e in events if e.get("pid") == -1 and e["ph"] == "i"]
    assert [name for name, _ in marks] == ["growing in place", "resized in place"], marks
    assert marks[0][1] == {"from": 2, "to": 3, "why": "free slots for 3 ranks"}
    assert (marks[1][1]["from"], marks[1][1]["to"], marks[1][1]["commit"]) == (2, 3, 4)

    groups.clear()

    def cannot(spec: AttemptSpec) -> FakeGroup:
        group = GrowsInPlace(able=False) if spec.attempt == 0 else FakeGroup(succeeds(3), {})
        groups.append(group)
        return group

    assert len(Job(config, b"job", cannot, capacity=lambda spec, held: 3).run()) == 3
    assert len(groups) == 2 and not groups[0].added  # grown by a restart, nothing added


def test_a_rank_reads_the_word_to_grow_by_the_world_it_is_in():
    """HostsUpdated names the world to grow into in place: a rank already in it (a late word,
    or one spent by the re-form) reads nothing; without a world it is a growth by restart."""
    link.attach(link.DriverLink(FakeConnection(), 0, b"secret"))  # type: ignore[arg-type]
    try:
        assert elastic.growth_word(0) == 0
        elastic.hear(HostsUpdated(1))
        assert (elastic.growth_word(0), elastic.growth_word(1)) == (elastic.GROW_IN_PLACE, 0)
        elastic.grown(1)  # re-formed into world 1: the word is spent
        assert not elastic.hosts_updated() and elastic.growth_word(1) == 0
        elastic.hear(HostsUpdated())
        assert elastic.growth_word(1) == elastic.GROW_BY_RESTART
    finally:
        link.detach()
    assert not elastic.hosts_updated() and elastic.growth_word(1) == 0  # nothing without a link
