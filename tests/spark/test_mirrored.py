"""MirroredStrategyRunner on real local Spark (local[2]) and in local mode.

Each rank imports TensorFlow (seconds), so the jobs are few: one training job per master, plus
failures that never import it. The local-cluster run is in test_engine_cluster.py.
"""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")

import hora
from hora.spark import MirroredStrategyRunner
from tests.spark._tf_jobs import EXPECTED, train
from tests.spark.conftest import start_spark, stop_spark

pytestmark = [pytest.mark.spark, pytest.mark.tensorflow]


@pytest.fixture(scope="module")
def spark():
    session = start_spark("local[2]")
    yield session
    stop_spark(session)


def test_a_function_on_two_tasks_returns_rank_0s_value(spark):
    assert MirroredStrategyRunner(num_slots=2, use_gpu=False).run(train, scale=2.0) == EXPECTED


def fail_on_rank_1() -> str:
    import os

    if os.environ["RANK"] == "1":
        raise RuntimeError("rank 1 gives up")
    return "rank 0 done"


def test_a_failing_rank_fails_the_run(spark):
    runner = MirroredStrategyRunner(num_slots=2, use_gpu=False, use_custom_strategy=True)
    with pytest.raises(hora.WorkerFailedError, match="rank 1 gives up"):
        runner.run(fail_on_rank_1)


def test_too_many_slots_are_refused_before_launch(spark):
    runner = MirroredStrategyRunner(num_slots=3, use_gpu=False, use_custom_strategy=True)
    with pytest.raises(Exception, match="3") as info:
        runner.run(fail_on_rank_1)
    assert not isinstance(info.value, hora.WorkerFailedError), info.value


def test_argument_errors(spark):
    with pytest.raises(ValueError, match="num_slots"):
        MirroredStrategyRunner(num_slots=0)
    local = MirroredStrategyRunner(num_slots=2, local_mode=True, use_gpu=False)
    with pytest.raises(ValueError, match="num_slots must be 1"):  # in run, as the original
        local.run(fail_on_rank_1)
    with pytest.raises(TypeError, match="callable"):
        MirroredStrategyRunner(num_slots=1, use_gpu=False).run("train.py")


def test_use_gpu_needs_the_task_gpu_amount(spark):
    with pytest.raises(ValueError, match=r"spark\.task\.resource\.gpu\.amount"):
        MirroredStrategyRunner(num_slots=2)  # in the constructor, as the original


def _local_train(scale: float) -> tuple:
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    mwms = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    return mwms, strategy.num_replicas_in_sync, os.environ.get("TF_CONFIG")


def test_local_mode_runs_one_process_on_the_driver():
    runner = MirroredStrategyRunner(num_slots=1, local_mode=True, use_gpu=False)
    assert runner.run(_local_train, scale=1.0) == (True, 1, None)
