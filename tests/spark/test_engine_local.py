"""The Spark engine on a real `local[2]` SparkSession: results, env, logs, failures, slots."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pytest
import torch

import hora
from hora.engines.spark import failures as _spark_failures
from hora.job import elastic as job_elastic
from tests import _workers
from tests.elastic import _jobs as _elastic
from tests.spark import _jobs
from tests.spark.conftest import start_spark, stop_spark

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark():
    session = start_spark("local[2]")
    yield session
    stop_spark(session)


def test_runner_np_positive_runs_on_spark_and_returns_rank_zero(spark):
    rank, pid, _host = hora.Runner(np=2).run(_jobs.whoami)
    assert rank == 0 and pid > 0


def test_run_auto_picks_spark_and_returns_every_rank(spark):
    results = hora.run(_workers.rank_times, (10,), np=2)  # backend="auto"
    assert results == [0, 10]


def test_run_auto_finds_the_session_from_another_thread(spark, capfd):
    """getActiveSession() is per thread; a notebook's helper thread must still get Spark."""
    results: list = []
    thread = threading.Thread(target=lambda: results.append(hora.run(_jobs.whoami, np=2)))
    thread.start()
    thread.join(120)
    assert [rank for rank, _pid, _host in results[0]] == [0, 1]
    out, _ = capfd.readouterr()
    assert "[0@" in out and "] hello from rank 0" in out  # rank@host: the Spark engine's mark


def test_gloo_allreduce_with_no_init_arguments(spark):
    assert hora.run(_workers.gloo_allreduce, np=2, backend="spark") == [3.0, 3.0]


def test_env_contract_equals_local_mode(spark):
    env = {"USER_VAR": "from-the-user"}
    on_spark = hora.run(_jobs.contract, np=2, backend="spark", env=env)
    local = hora.run(_jobs.contract, np=2, backend="local", env=env)
    assert on_spark == local
    assert [e["RANK"] for e in on_spark] == ["0", "1"]
    assert [e["LOCAL_RANK"] for e in on_spark] == ["0", "1"]
    assert on_spark[0]["USER_VAR"] == "from-the-user"


def test_large_result_travels_through_the_channel(spark):
    results = hora.run(_jobs.big_result, (64,), np=2, backend="spark")
    assert [len(r) for r in results] == [64 << 20] * 2
    assert results[1][:3] == b"\x01\x01\x01"


def test_logs_are_live_and_marked_with_rank_and_host(spark, capfd):
    assert hora.run(_workers.chatter, (50,), np=2, backend="spark") == ["done", "done"]
    out, err = capfd.readouterr()
    for rank in (0, 1):
        lines = [line for line in out.splitlines() if f" out {rank} " in line]
        assert len(lines) == 50, out[-2000:]
        assert all(line.startswith(f"[{rank}@") for line in lines)
        assert sum(f"] err {rank} " in line for line in err.splitlines()) == 50
        assert out.count(f"last words of {rank} without newline") == 1


def test_log_callback_only(spark, capfd):
    hora.Runner(np=2, driver_log_verbosity="log_callback_only").run(_workers.log_and_print)
    out, _ = capfd.readouterr()
    assert "plain print" not in out
    assert "callback message from 0" in out and "callback message from 1" in out


def test_failing_rank_stops_the_stage_with_the_remote_traceback(spark):
    start = time.monotonic()
    with pytest.raises(hora.WorkerFailedError) as info:
        hora.run(_jobs.fail_after_peer_started, (1,), np=2, backend="spark")
    assert time.monotonic() - start < 30
    message = str(info.value)
    assert message.startswith("rank 1 failed: RuntimeError: deliberate failure on rank 1")
    assert "_jobs.py" in message and "fail_after_peer_started" in message  # the worker's frames
    assert info.value.rank == 1


def test_failure_is_reported_within_ten_seconds(spark):
    start = time.monotonic()
    with pytest.raises(hora.WorkerFailedError, match="rank 0 failed: ValueError"):
        hora.run(_workers.fail_on, (0, "raise"), np=2, backend="spark")
    assert time.monotonic() - start < 10


def test_killed_worker_process(spark):
    with pytest.raises(hora.WorkerFailedError) as info:
        hora.run(_workers.killed_while_peer_in_collective, np=2, backend="spark")
    assert str(info.value).startswith("rank 1 failed: killed by signal 9 (SIGKILL)")


def test_lost_spark_task_fails_the_job_and_stops_its_orphaned_rank(spark):
    start = time.monotonic()
    with pytest.raises(hora.WorkerFailedError) as info:
        hora.run(_jobs.kill_own_spark_task, (1,), np=2, backend="spark")
    assert time.monotonic() - start < 15
    assert str(info.value).startswith("rank 1 failed: its Spark task ended before its worker")
    # the autouse fixture checks that rank 1's process, orphaned by its task, is gone too


def test_too_many_ranks_fail_at_once_saying_what_to_change(spark):
    start = time.monotonic()
    with pytest.raises(ValueError) as info:
        hora.Runner(np=3).run(_workers.rank_times, x=1)
    assert time.monotonic() - start < 5
    message = str(info.value)
    assert "np=3" in message and "has 2" in message and "local[N]" in message


def test_start_timeout_when_slots_are_busy(spark):
    """Another job holds a slot: the stage cannot start, and start_timeout says which ranks."""
    sc = spark.sparkContext
    blocker_started = threading.Event()

    def block() -> None:
        sc.setJobGroup("hora-test-blocker", "holds one slot", interruptOnCancel=True)
        blocker_started.set()
        with contextlib.suppress(Exception):  # cancelled below
            sc.parallelize([0], 1).map(lambda _: time.sleep(120)).collect()

    from pyspark import InheritableThread

    blocker = InheritableThread(target=block, daemon=True)
    blocker.start()
    blocker_started.wait()
    time.sleep(1.0)  # let the blocking task take its slot
    try:
        start = time.monotonic()
        with pytest.raises(hora.RunTimeoutError) as info:
            hora.run(_workers.rank_times, (1,), np=2, backend="spark", start_timeout=3)
        assert time.monotonic() - start < 15
        assert "did not start within start_timeout=3" in str(info.value)
        assert set(info.value.ranks) == {0, 1}
    finally:
        sc.cancelJobGroup("hora-test-blocker")
        blocker.join(30)
    # the slots are free again: the next run works
    assert hora.run(_workers.rank_times, (2,), np=2, backend="spark") == [0, 2]


def test_unpicklable_function_fails_before_any_task(spark):
    lock = threading.Lock()

    def main():
        return lock

    with pytest.raises(hora.UnpicklableError, match="lock"):
        hora.Runner(np=2).run(main)


def test_a_failed_task_is_named_from_spark_s_own_error(spark):
    """A task's Python error reaches the driver inside a Py4J error of Java frames; the engine
    reads the task and the error's last line from it (here of a real barrier stage)."""

    def fail_in_task_one(partition):
        from pyspark import BarrierTaskContext

        if BarrierTaskContext.get().partitionId() == 1:
            raise ValueError("task one cannot start")
        yield from partition

    sc = spark.sparkContext
    with pytest.raises(Exception) as info:
        sc.parallelize(range(2), 2).barrier().mapPartitions(fail_in_task_one).collect()
    failure = _spark_failures.read(info.value, {}, sc.master, on_driver_python=True)
    assert (failure.task, failure.summary) == (1, "ValueError: task one cannot start")
    assert "Traceback" in failure.detail and "\tat " not in failure.detail


def test_use_gpu_without_gpu_tasks_is_refused(spark):
    """The engine's own check (the doors refuse earlier, in their constructors)."""
    from hora.config import RunConfig
    from hora.engines.base import AttemptSpec
    from hora.engines.spark.launcher import SparkLauncher

    options = RunConfig(np=2, backend="spark").engine_options
    with pytest.raises(ValueError, match=r"spark.task.resource.gpu.amount"):
        SparkLauncher(AttemptSpec(np=2, use_gpu=True, options=options))


def test_an_elastic_run_s_survivors_of_a_lost_spark_task_re_form_and_grow_back_in_place(
    spark, tmp_path, monkeypatch, capfd
):
    """np=2, min_np=1: rank 1 SIGKILLs its Spark task's Python worker mid-epoch, which fails
    that task (local mode tries a task once). Each rank of an elastic run is a Spark job of its
    own, so rank 0's task lives on: it keeps its process, trains on alone in place, and once the
    settle time has passed a new task joins it in place, the run going on at 2 from rank 0's
    state. Every sample of every epoch once; the weights those of one process on the same
    steps; the lost task's job ends with the run."""
    monkeypatch.setenv("HORA_ELASTIC_SETTLE_SECONDS", "1")
    (tmp_path / _elastic.BACK_MARK).touch()  # the slot is free again at once
    plan = _elastic.Plan(
        str(tmp_path),
        full=2,
        samples=96,
        commit_every=3,
        fault="actor",  # the rank's parent: its Spark task's Python worker
        fault_commit=1,
        wait_for_return=True,
    )
    results = hora.run(_elastic.train, (plan,), np=2, min_np=1, backend="spark", timeout=240)
    steps, worlds, starts = _elastic.kept_steps(str(tmp_path))
    _elastic.check_in_place(str(tmp_path), results, small=1)
    assert worlds == [2, 1, 2], worlds
    assert starts[0] == 0 and 0 < starts[1] < starts[2], starts
    assert _elastic.samples_per_epoch(steps) == {e: list(range(96)) for e in range(plan.epochs)}
    want = _elastic.reference(plan, steps)
    for r in results:
        for key, value in want.items():
            torch.testing.assert_close(r["weights"][key], value, rtol=0, atol=1e-10)
    err = capfd.readouterr().err
    assert "hora: restarting" not in err and "hora: resizing from" not in err, err
    assert "hora: resized in place from 2 to 1 ranks in " in err, err
    assert "its Spark task ended before its worker exited" in err, err
    assert "hora: resized in place from 1 to 2 ranks in " in err, err


def test_an_elastic_run_grows_back_at_once_where_the_lost_rank_s_task_ended_by_itself(
    spark, tmp_path, monkeypatch
):
    """The engine's settle time (here 120 s, longer than the run may take) is waited before a
    growth where Spark's count may still hold a lost executor's slots. A rank that died under
    its live task ends that task by itself (its supervisor returns): its slot is free on an
    executor Spark still has, so the run grows back in place at once."""
    plan = _settle_outlasting_run(tmp_path, monkeypatch, "self")
    results = hora.run(_elastic.train, (plan,), np=2, min_np=1, backend="spark", timeout=100)
    steps, worlds, _ = _elastic.kept_steps(str(tmp_path))
    assert worlds == [2, 1, 2], worlds
    assert _elastic.samples_per_epoch(steps) == {e: list(range(96)) for e in range(plan.epochs)}
    assert len(results) == 2


def test_a_lost_rank_s_failed_spark_task_keeps_the_settle_time_before_a_growth(
    spark, tmp_path, monkeypatch, capfd
):
    """A task that failed (its Python worker killed, as when its executor is lost) does not
    say its slot is free: the growth waits the settle time (120 s), so the rank that holds its
    commit until the run grows is still waiting at the run's timeout. The timed-out run's
    commits on this host (its ranks' /dev/shm) are gone with it: nothing resumes them."""
    from hora.checkpoint._commits import _root as commit_stores

    plan = _settle_outlasting_run(tmp_path, monkeypatch, "actor")
    before = set(commit_stores().iterdir()) if commit_stores().exists() else set()
    with pytest.raises(hora.errors.RunTimeoutError):
        hora.run(_elastic.train, (plan,), np=2, min_np=1, backend="spark", timeout=25)
    err = capfd.readouterr().err
    assert "hora: resized in place from 2 to 1 ranks in " in err, err
    assert "growing in place" not in err, err
    after = set(commit_stores().iterdir()) if commit_stores().exists() else set()
    assert after <= before, after - before


def _settle_outlasting_run(tmp_path: Any, monkeypatch: Any, fault: str) -> _elastic.Plan:
    """np=2, min_np=1 whose last rank is lost at its first commit ("self": it SIGKILLs itself;
    "actor": it SIGKILLs its task's Python worker); rank 0 then holds its next commit until the
    run grows; the engine's settle time (no HORA_ELASTIC_SETTLE_SECONDS) 120 s."""
    monkeypatch.delenv(job_elastic.SETTLE_ENV, raising=False)
    monkeypatch.setattr(job_elastic, "DEFAULT_SETTLE_SECONDS", 120.0)
    (tmp_path / _elastic.BACK_MARK).touch()  # the slot is free again at once
    return _elastic.Plan(
        str(tmp_path), full=2, samples=96, commit_every=3, fault=fault, wait_for_return=True
    )
