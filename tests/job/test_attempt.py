"""One attempt's decisions (`hora.job.attempt`), through its monitor and a fake group replaying
random endings of its ranks (tests/job/_fakes.py), against the guarantees the driver relies on:
a result only from a rank of the world as it ended, each once and in rank order; a failure of
the job's own never re-formed; no world re-formed below `min_np`; the states in their order."""

from __future__ import annotations

import threading
import time
from typing import Any

import cloudpickle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hora.engines import Capabilities
from hora.job import attempt
from hora.job.callbacks import MonitorCallback
from hora.job.monitor import Monitor
from hora.job.outcome import Failed, Finished, Limits
from hora.job.state import AttemptState
from hora.wire.protocol import Error, Exited, Hello, InPlace, Result
from tests.job._fakes import FakeConnection, FakeGroup, hellos

LIMITS = Limits(start_timeout=10.0, timeout=None, deadline=None)
ENDINGS = ("returns", "returns", "killed", "raises")


class States(MonitorCallback):
    def __init__(self) -> None:
        self.seen: list[AttemptState] = []

    def on_state(self, attempt: Any, previous: Any, current: AttemptState) -> None:
        self.seen.append(current)


class ReformingGroup(FakeGroup):
    """A fake group whose engine keeps a lost rank's survivors running (they re-form): what
    follows a kill comes after the settle time, as a survivor's next word would."""

    capabilities = Capabilities(reforms_in_place=True)

    def start(self) -> None:
        self.started = True
        threading.Thread(target=self._replay, daemon=True).start()

    def _replay(self) -> None:
        for message in self.script:
            conn = FakeConnection() if isinstance(message, Hello) else None
            self.events.put((conn, message))
            if isinstance(message, Exited) and message.code < 0:
                time.sleep(attempt.SETTLE_SECONDS + 0.2)


def _script(endings: list[str], order: list[int], in_place: bool) -> list[object]:
    script: list[object] = hellos(len(endings))
    if in_place:
        script += [InPlace(pid, able=True, grows=True) for pid in range(len(endings))]
    for pid in order:
        match endings[pid]:
            case "returns":
                script += [Result(pid, cloudpickle.dumps(pid)), Exited(pid, 0)]
            case "killed":
                script.append(Exited(pid, -9))
            case "raises":
                script += [Error(pid, "ValueError: no", "Traceback\nValueError: no", 0.0)]
                script.append(Exited(pid, 1))
    return script


@settings(max_examples=30, deadline=None)
@given(
    endings=st.lists(st.sampled_from(ENDINGS), min_size=2, max_size=4),
    min_np=st.integers(1, 3),
    in_place=st.booleans(),
    order=st.permutations(range(4)),
)
def test_random_endings_keep_the_attempt_s_guarantees(endings, min_np, in_place, order):
    np = len(endings)
    min_np = min(min_np, np)
    order = [pid for pid in order if pid < np]
    outcome, seen = _attempt(endings, order, min_np, in_place)

    lost = [pid for pid in range(np) if endings[pid] != "returns"]
    if isinstance(outcome, Finished):
        # only the world as it ended returned, each rank once, in the order of its processes
        survivors = [pid for pid in range(np) if pid not in lost]
        values = [cloudpickle.loads(data) for _, data in sorted(outcome.results.items())]
        assert values == survivors and outcome.np == len(survivors)
        assert "raises" not in endings, "a job's own exception was re-formed past"
        assert not lost or (in_place and len(survivors) >= min_np)
    else:
        assert isinstance(outcome, Failed) and lost
    # the states in their order: one start, one end, then the stop
    assert seen[0] is AttemptState.STARTING and seen[-1] is AttemptState.STOPPING
    ends = [s for s in seen if s.ended]
    assert len(ends) == 2 and ends[0] in (AttemptState.SUCCEEDED, AttemptState.FAILED)
    assert (ends[0] is AttemptState.SUCCEEDED) == isinstance(outcome, Finished)


def _attempt(endings: list[str], order: list[int], min_np: int, in_place: bool) -> tuple:
    group_type = ReformingGroup if in_place else FakeGroup
    group = group_type(_script(endings, order, in_place), {})
    states = States()
    np = len(endings)
    monitor = Monitor(group, np, b"job", True, [states], min_np=min_np, in_place=in_place)
    outcome = monitor.run(LIMITS)
    monitor.finish()
    return outcome, states.seen


@pytest.mark.parametrize("order", [[1, 0, 2], [1, 2, 0]])
def test_a_killed_rank_s_survivors_finish_in_place(order):
    """Killed before any survivor was done: the two survivors re-form and finish (one done
    first would end the attempt: docs/elastic.md)."""
    outcome, seen = _attempt(["returns", "killed", "returns"], order, 2, in_place=True)
    assert isinstance(outcome, Finished) and outcome.np == 2
    assert [cloudpickle.loads(v) for _, v in sorted(outcome.results.items())] == [0, 2]
    assert AttemptState.FAILING in seen  # the loss, judged before the world re-formed
