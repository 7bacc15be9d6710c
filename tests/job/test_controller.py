"""The run controller's decisions between attempts, over random sequences of attempts' ends:
the restart rule (torchrun's max_restarts), timeouts never restarted, elastic sizing after a
failure and growth by a restart, the newest commit known, the stories kept in order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hora.errors import RunTimeoutError, WorkerFailedError
from hora.job.controller import (
    Fail,
    Finish,
    RunController,
    RunPhase,
    SizeNext,
    StartAttempt,
)
from hora.job.outcome import Failed, Finished, StoppedToGrow, TimedOut
from hora.job.policy import FailurePolicy

ENDS = st.sampled_from(["failed", "finished", "timed out", "grow"])


def _outcome(kind: str, np: int, index: int, commit: int) -> object:
    hosts = {r: f"h{r % 2}" for r in range(np)}
    if kind == "failed":
        return Failed(np=np, hosts=hosts, error=WorkerFailedError(f"rank 1 failed {index}", 1))
    if kind == "timed out":
        return TimedOut(np=np, hosts=hosts, error=RunTimeoutError(f"late {index}", [0]))
    if kind == "grow":
        return StoppedToGrow(np=np, hosts=hosts, commit=commit)
    return Finished(np=np, hosts=hosts, results={r: b"x" for r in range(np)})


@settings(max_examples=300, deadline=None)
@given(
    max_restarts=st.integers(0, 4),
    elastic=st.booleans(),
    ends=st.lists(ENDS, min_size=1, max_size=12),
    sizes=st.lists(st.integers(1, 6), min_size=12, max_size=12),
    commits=st.lists(st.integers(0, 50), min_size=12, max_size=12),
)
def test_random_attempt_ends_keep_the_run_s_guarantees(max_restarts, elastic, ends, sizes, commits):
    controller = RunController(FailurePolicy(max_restarts), 2, elastic, min_np=1)
    attempt, decision, newest, failed = controller.attempt, None, -1, 0
    for step, kind in enumerate(ends):
        if kind == "grow" and not (elastic and attempt.index < max_restarts):
            kind = "finished"  # the growth watch asks to stop only so (hora.job.callbacks.Grow)
        decision = controller.ended(_outcome(kind, attempt.np, attempt.index, commits[step]))
        if isinstance(decision, SizeNext):
            assert elastic and controller.phase is RunPhase.SIZING
            assert decision.settle is (kind == "failed")  # a growth does not wait to settle
            decision = controller.sized(sizes[step])
            assert isinstance(decision, StartAttempt) and decision.attempt.np == sizes[step]
        failed += kind == "failed"
        if kind == "grow":
            newest = max(newest, commits[step])
        assert controller.known_commit == newest
        if isinstance(decision, StartAttempt):
            # every attempt after the first spends one restart, of the same size unless elastic
            assert decision.attempt.index == attempt.index + 1 <= max_restarts
            assert elastic or decision.attempt.np == attempt.np
            assert controller.phase is RunPhase.RUNNING
            attempt = decision.attempt
            continue
        if kind == "finished":
            assert isinstance(decision, Finish) and len(decision.results) == decision.np
            assert controller.phase is RunPhase.FINISHED
        else:
            assert isinstance(decision, Fail) and controller.phase is RunPhase.FAILED
            if kind == "timed out":  # never restarted; earlier failures are said with it
                assert isinstance(decision.error, RunTimeoutError)
                assert ("Earlier attempts failed" in str(decision.error)) is (failed > 0)
            else:  # the restarts were spent: every attempt's story, or the only one
                assert attempt.index == max_restarts
                assert isinstance(decision.error, WorkerFailedError)
                assert len(decision.error.attempts) == (failed if failed > 1 else 0)
        break
    assert len(controller.failed) == failed


def test_an_elastic_failure_says_its_story_then_resizes_naming_the_lost_host():
    controller = RunController(FailurePolicy(2), 4, elastic=True, min_np=2)
    error = WorkerFailedError("rank 3 failed: killed\nmore", 3)
    decision = controller.ended(Failed(np=4, hosts={3: "host2"}, error=error))
    assert isinstance(decision, SizeNext) and decision.mark.say.startswith("hora: attempt 1 of 3")
    start = controller.sized(2)
    assert start.mark.say == (
        "hora: resizing from 4 to 2 ranks (lost host2: rank 3 failed: killed); the ranks resume "
        "from their last commit"
    )
    assert start.mark.args == {"from": 4, "to": 2, "why": "lost host2: rank 3 failed: killed"}


def test_too_few_slots_after_a_growth_says_the_slots_left():
    controller = RunController(FailurePolicy(2), 2, elastic=True, min_np=2)
    controller.ended(StoppedToGrow(np=2, hosts={}, commit=7))
    fail = controller.too_few_slots(1, 30.0)
    assert "the slots it was to grow into left" in str(fail.error)
    assert "min_np=2" in str(fail.error) and controller.phase is RunPhase.FAILED
