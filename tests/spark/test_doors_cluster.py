"""The Spark doors held to their originals on `local-cluster[2,1,1024]`: two executors with two
fake GPUs each (a discovery script hands the first worker addresses 0,1 and the second 2,3),
two GPUs per task, and CUDA_VISIBLE_DEVICES=10,11,12,13 in the executors, so Spark's address
`i` is CUDA device `10 + i` there, as both originals read it.

Each test is one of issue 26's differences and fails on main 5627863, or one of the originals'
own tests with only the class swapped (spark-tensorflow-distributor's, from its source).
"""

from __future__ import annotations

import json

import pytest

import hora
from hora.spark import DeepspeedTorchDistributor, MirroredStrategyRunner, TorchDistributor
from tests.spark import _jobs
from tests.spark.conftest import fake_gpus, start_spark, stop_spark

pytestmark = pytest.mark.spark

EXECUTOR_CUDA_DEVICES = ["10", "11", "12", "13"]


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    script = fake_gpus(tmp_path_factory.mktemp("gpus"), ["0", "1"], ["2", "3"])
    session = start_spark(
        "local-cluster[2,1,1024]",
        **{
            "spark.worker.resource.gpu.amount": "2",
            "spark.worker.resource.gpu.discoveryScript": script,
            "spark.executor.resource.gpu.amount": "2",
            "spark.task.resource.gpu.amount": "2",
            "spark.executorEnv.CUDA_VISIBLE_DEVICES": ",".join(EXECUTOR_CUDA_DEVICES),
        },
    )
    yield session
    stop_spark(session)


def _by_partition(gathered: list[str]) -> list[dict]:
    return [json.loads(task) for task in gathered]


def _cuda(addresses: list[str]) -> list[str]:
    return [EXECUTOR_CUDA_DEVICES[int(a)] for a in addresses]


def test_mirrored_strategy_runner_splits_num_slots_over_its_tasks(spark):
    """The original's test_equal_gpu_allocation: 3 slots on tasks of 2 GPUs are 2 tasks, the
    first with 2 GPUs and the second with 1, each mapped through the executor's
    CUDA_VISIBLE_DEVICES (main: no `sc`, every task's GPUs, unmapped, and no TaskContext)."""
    runner = MirroredStrategyRunner(num_slots=3, use_custom_strategy=True)
    assert int(runner.sc.getConf().get("spark.task.resource.gpu.amount")) == 2
    assert runner.get_num_tasks() == 2
    tasks = _by_partition(runner.run(_jobs.gpus_by_partition))
    assert [len(t["visible"].split(",")) for t in tasks] == [2, 1]
    for task, count in zip(tasks, (2, 1), strict=True):
        assert len(task["addresses"]) == 2
        assert task["visible"] == ",".join(_cuda(task["addresses"])[:count])


def test_mirrored_strategy_runner_cpu_training_sees_no_gpu(spark):
    """The original's test_cpu_training_with_gpus: GPU tasks, use_gpu=False, no GPU visible."""
    runner = MirroredStrategyRunner(num_slots=2, use_gpu=False, use_custom_strategy=True)
    assert runner.get_num_tasks() == 2
    tasks = _by_partition(runner.run(_jobs.gpus_by_partition))
    assert [t["visible"] for t in tasks] == ["", ""]
    assert all(len(t["addresses"]) == 2 for t in tasks)  # Spark gave them GPUs all the same


def test_a_rank_sees_its_task_s_gpus_as_the_executor_numbers_them(spark):
    """Any door: a task's GPU addresses go through the executor's CUDA_VISIBLE_DEVICES."""
    seen = sorted(v for v, _ in hora.run(_jobs.visible_gpus, np=2, backend="spark"))
    assert seen == ["10,11", "12,13"]


def test_torch_distributor_refuses_several_gpus_per_task_in_the_constructor(spark):
    """pyspark's RuntimeError when num_processes is no multiple of the GPUs per task; where
    pyspark would run several processes per task, hora (one rank per task) refuses there too."""
    with pytest.raises(RuntimeError, match="must be a multiple"):
        TorchDistributor(num_processes=3, local_mode=False, use_gpu=True)
    with pytest.raises(RuntimeError, match="one rank per Spark task"):
        DeepspeedTorchDistributor(numGpus=2, nnodes=2, localMode=False, useGpu=True)


def test_local_mode_without_driver_gpus(spark):
    """pyspark's test_get_num_tasks_fails; the original runner's missing-resource error."""
    for num_processes in (1, 5, 4):
        with pytest.raises(RuntimeError, match="GPUs were unable to be found"):
            TorchDistributor(num_processes, True, True)
    runner = MirroredStrategyRunner(num_slots=1, local_mode=True)
    with pytest.raises(ValueError, match="resource name `gpu` was not found"):
        runner.run(_jobs.cuda_visible_devices)
