"""The Spark doors held to their originals on a real `local[2]` Spark.

The driver has three fake GPUs (addresses 0,1,2, from a discovery script, as pyspark's own tests
give them) and the tasks see CUDA_VISIBLE_DEVICES=3,4,5 (`spark.executorEnv`), as an executor
given GPUs 3-5 would. The first tests are issue 26's differences, each failing on main 5627863;
the last ones are pyspark's public-behaviour tests of TorchDistributor and
DeepspeedTorchDistributor (pyspark/ml/torch/tests, pyspark/ml/deepspeed/tests) with only the
class swapped, where they run here. The local-cluster ones are in test_doors_cluster.py.
"""

from __future__ import annotations

import logging

import pytest

import hora
from hora.spark import DeepspeedTorchDistributor, MirroredStrategyRunner, TorchDistributor
from tests import _workers
from tests.spark import _jobs, _pyspark_training_file
from tests.spark.conftest import fake_gpus, start_spark, stop_spark

pytestmark = pytest.mark.spark

TRAINING_FILE = _pyspark_training_file.__file__
TASK_CUDA_DEVICES = "3,4,5"


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    script = fake_gpus(tmp_path_factory.mktemp("gpus"), ["0", "1", "2"])
    session = start_spark(
        "local[2]",
        **{
            "spark.driver.resource.gpu.amount": "3",
            "spark.driver.resource.gpu.discoveryScript": script,
            "spark.executorEnv.CUDA_VISIBLE_DEVICES": TASK_CUDA_DEVICES,
        },
    )
    yield session
    stop_spark(session)


@pytest.fixture
def driver_cuda(monkeypatch):
    """The driver process sees GPUs 3,4,5 (Spark's addresses 0,1,2 index into them)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,4,5")


@pytest.fixture
def tls_cluster(spark):
    """spark.ssl.enabled=true on the live context (only hora's and the doors' checks read it)."""
    conf = spark.sparkContext._conf
    conf.set("spark.ssl.enabled", "true")
    yield conf
    for key in ("spark.ssl.enabled", *SSL_KEYS.values(), "spark.hora.ignoreSsl"):
        conf.set(key, "false")


# ----- issue 26's differences ------------------------------------------------------------------
def test_gpus_are_checked_in_the_constructor_with_pyspark_s_error(spark):
    """pyspark: RuntimeError from the constructor; main: ValueError from run()."""
    with pytest.raises(RuntimeError, match=r"'spark\.task\.resource\.gpu\.amount' was unset"):
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=True)
    with pytest.raises(RuntimeError, match=r"'spark\.task\.resource\.gpu\.amount' was unset"):
        DeepspeedTorchDistributor(numGpus=2, localMode=False, useGpu=True)


def test_deepspeed_takes_num_gpus_true_as_one_process(spark, tmp_path):
    """pyspark's own test builds DeepspeedTorchDistributor(numGpus=True, ...); main refused it."""
    for local_mode in (True, False):
        distributor = DeepspeedTorchDistributor(
            numGpus=True, nnodes=1, localMode=local_mode, useGpu=False
        )
        assert distributor.num_processes == 1
        assert distributor.run(TRAINING_FILE, "0.01") is None


def test_local_mode_gpus_map_through_cuda_visible_devices(spark, driver_cuda):
    """Driver GPUs 0,1,2 under CUDA_VISIBLE_DEVICES=3,4,5 are devices 3,4,5; main gave 0,1."""
    visible, _ = TorchDistributor(num_processes=2, local_mode=True).run(_jobs.visible_gpus)
    assert visible == "3,4"
    runner = MirroredStrategyRunner(num_slots=2, local_mode=True, use_custom_strategy=True)
    assert runner.run(_jobs.cuda_visible_devices) == "3,4"


def test_cpu_training_hides_the_gpus(spark, driver_cuda):
    """use_gpu=False blanks CUDA_VISIBLE_DEVICES in Spark tasks (both originals) and in
    MirroredStrategyRunner's local process; main left the executor's 3,4,5 visible."""
    visible, _ = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        _jobs.visible_gpus
    )
    assert visible == ""
    runner = MirroredStrategyRunner(num_slots=2, use_gpu=False, use_custom_strategy=True)
    assert runner.run(_jobs.cuda_visible_devices) == ""
    local = MirroredStrategyRunner(
        num_slots=1, local_mode=True, use_gpu=False, use_custom_strategy=True
    )
    assert local.run(_jobs.cuda_visible_devices) == ""


# ----- issue 31: pyspark's torchrun per task, pyspark's RuntimeError -----------------------------
def test_torch_distributor_ranks_see_pyspark_s_torchrun_per_task(spark):
    """pyspark starts one `torchrun --nnodes=<tasks> --node_rank=<task>` of one process per task:
    LOCAL_RANK 0 in each, GROUP_RANK and NODE_RANK the task's index, TORCHELASTIC_RUN_ID set.
    main numbered LOCAL_RANK per host (1 for the second task) and set no run id, so Lightning's
    Trainer(devices=1, num_nodes=2) failed. hora's own numbering stays per host."""
    for door in (
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False),
        DeepspeedTorchDistributor(numGpus=2, localMode=False, useGpu=False),
    ):
        views = door.run(_jobs.torchrun_view)
        run_ids = {v["TORCHELASTIC_RUN_ID"] for v in views}
        assert len(run_ids) == 1 and None not in run_ids
        for rank, view in enumerate(views):
            assert view["torchelastic"] is True
            assert (view["RANK"], view["WORLD_SIZE"]) == (str(rank), "2")
            assert (view["LOCAL_RANK"], view["LOCAL_WORLD_SIZE"]) == ("0", "1")
            assert view["GROUP_RANK"] == view["NODE_RANK"] == str(rank)
            assert view["GROUP_WORLD_SIZE"] == "2"
            assert view["ROLE_NAME"] == "default" and view["TORCHELASTIC_RESTART_COUNT"] == "0"
            assert view["hvd"] == (rank, rank, 2, 0)  # rank, local_rank, local_size, cross_rank


def test_horovod_doors_keep_host_local_ranks_and_set_the_run_id(spark):
    """HorovodRunner numbers the host's ranks as horovodrun does, under torchrun's names too;
    every door marks a torchrun-style launch (main set no TORCHELASTIC_RUN_ID)."""
    for views in (
        hora.HorovodRunner(np=2).run(_jobs.torchrun_view),
        TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(_jobs.torchrun_view),
    ):
        for rank, view in enumerate(views):
            assert view["torchelastic"] is True
            assert (view["LOCAL_RANK"], view["LOCAL_WORLD_SIZE"]) == (str(rank), "2")
            assert (view["GROUP_RANK"], view["NODE_RANK"]) == ("0", None)
            assert view["hvd"] == (rank, rank, 2, 0)


def test_a_failed_run_is_a_runtime_error_as_pyspark_s(spark):
    """pyspark raises RuntimeError when the training fails; callers catch that. main's
    WorkerFailedError was no RuntimeError."""
    for local_mode in (True, False):
        door = TorchDistributor(num_processes=2, local_mode=local_mode, use_gpu=False)
        with pytest.raises(RuntimeError, match="deliberate") as info:
            door.run(_workers.fail_on, 1, "raise")
        assert isinstance(info.value, hora.WorkerFailedError)
        assert isinstance(info.value, hora.HoraError)


SSL_KEYS = {
    "TorchDistributor": "pytorch.spark.distributor.ignoreSsl",
    "DeepspeedTorchDistributor": "deepspeed.spark.distributor.ignoreSsl",
    "MirroredStrategyRunner": "tensorflow.spark.distributor.ignoreSsl",
}


def _one_rank_run(door: str) -> object:
    if door == "MirroredStrategyRunner":
        runner = MirroredStrategyRunner(num_slots=1, use_gpu=False, use_custom_strategy=True)
        return runner.run(_workers.rank_times, x=3)
    if door == "DeepspeedTorchDistributor":
        distributor = DeepspeedTorchDistributor(numGpus=1, localMode=False, useGpu=False)
        return distributor.run(_workers.rank_times, 3)
    return TorchDistributor(num_processes=1, local_mode=False, use_gpu=False).run(
        _workers.rank_times, 3
    )


@pytest.mark.parametrize("door", list(SSL_KEYS))
def test_each_door_honours_its_original_s_ssl_setting(tls_cluster, door):
    """On a TLS cluster each door refuses in run() until its original's own setting opts in
    (main ignored spark-tensorflow-distributor's and the DeepSpeed door's settings)."""
    with pytest.raises(RuntimeError, match=f"encryption.*{SSL_KEYS[door]}"):
        _one_rank_run(door)
    tls_cluster.set(SSL_KEYS[door], "true")
    assert _one_rank_run(door) == 0


def test_barrier_task_context_in_a_rank_is_its_spark_task(spark):
    """Code written for the originals calls BarrierTaskContext.get() in the training function;
    main raised NOT_IN_BARRIER_STAGE there."""
    spark.sparkContext.setLocalProperty("hora.test.property", "set on the driver")
    try:
        views = hora.run(_jobs.task_context_view, np=2, backend="spark")
    finally:
        spark.sparkContext.setLocalProperty("hora.test.property", None)
    assert sorted(v["partition"] for v in views) == [0, 1]
    rank_of_partition = {v["partition"]: v["rank"] for v in views}
    for view in views:
        assert view["pyspark_imported_by_hora"] is False
        assert view["same_context"] is True  # TaskContext.get() is the barrier context
        assert view["gathered"] == [f"rank {rank_of_partition[p]}" for p in (0, 1)]
        assert view["attempt"] == 0 and view["cpus"] == 1 and view["resources"] == {}
        assert view["local_property"] == "set on the driver"
        assert len(view["task_infos"]) == 2
    assert views[0]["stage"] == views[1]["stage"]
    assert views[0]["task_attempt_id"] != views[1]["task_attempt_id"]


def test_mirrored_strategy_runner_keeps_the_original_s_sc_and_moments(spark):
    """The original's `sc`; its GPU task count in the constructor, its CPU local-mode check in
    run (main had no `sc` and checked the other way round)."""
    runner = MirroredStrategyRunner(num_slots=2, use_gpu=False)
    assert runner.sc is spark.sparkContext and runner.get_num_tasks() == 2
    with pytest.raises(ValueError, match=r"spark\.task\.resource\.gpu\.amount"):
        MirroredStrategyRunner(num_slots=2)  # the tasks have no GPUs
    local = MirroredStrategyRunner(num_slots=2, local_mode=True, use_gpu=False)
    with pytest.raises(ValueError, match="more than one CPU machine"):
        local.run(_jobs.cuda_visible_devices)


# ----- pyspark's tests of its doors, only the class swapped ------------------------------------
@pytest.mark.parametrize(
    ("num_processes", "local_mode", "use_gpu"),
    [(1, True, False), (100, True, False), (1, False, False), (100, False, False)],
)
def test_validate_correct_inputs(spark, num_processes, local_mode, use_gpu):
    dist = TorchDistributor(num_processes, local_mode, use_gpu)
    assert (dist.num_processes, dist.local_mode, dist.use_gpu, dist.num_tasks) == (
        num_processes,
        local_mode,
        use_gpu,
        num_processes,
    )


def test_validate_incorrect_inputs(spark):
    with pytest.raises(ValueError, match="positive"):
        TorchDistributor(0, False, False)


def test_get_num_tasks_locally(spark, caplog):
    for num_processes in (1, 2):
        assert TorchDistributor(num_processes, True, True).num_tasks == num_processes
    for num_processes in (4, 8):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="TorchDistributor"):
            distributor = TorchDistributor(num_processes, True, True)
        assert len(caplog.records) == 1 and caplog.records[0].name == "TorchDistributor"
        assert distributor.num_processes == 3


@pytest.mark.parametrize(
    ("cuda_env", "num_processes", "use_gpu", "expected"),
    [
        ("0,1,2", 1, True, {"0", "1", "2"}),  # pyspark samples at random, hora takes the first
        ("0,1,2", 3, True, {"0,1,2"}),
        ("0,1,2", 2, False, {"0,1,2"}),
        (None, 3, False, {None}),
    ],
)
def test_local_training_succeeds(spark, monkeypatch, cuda_env, num_processes, use_gpu, expected):
    if cuda_env is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cuda_env)
    dist = TorchDistributor(num_processes, local_mode=True, use_gpu=use_gpu)
    assert dist.run(_jobs.cuda_visible_devices) in expected


def test_local_file_with_pytorch(spark):
    TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(TRAINING_FILE, "0.01")


def test_end_to_end_run_locally(spark):
    dist = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False)
    assert dist.run(_jobs.ddp_training, 0.001) == "success"


def test_distributed_file_with_pytorch(spark):
    TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(TRAINING_FILE, "0.01")


def test_end_to_end_run_distributedly(spark):
    dist = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    assert dist.run(_jobs.ddp_training, 0.001) == "success"


def test_deepspeed_simple_function_e2e(spark):
    pytest.importorskip("deepspeed")
    dist = DeepspeedTorchDistributor(numGpus=2, nnodes=1, localMode=True, useGpu=False)
    assert dist.run(_jobs.pythagoras, 3, 4) == 5


def test_encryption_passes_and_fails(tls_cluster):
    """pyspark's test_encryption_passes / _fails, through run() (pyspark checks there too)."""
    with pytest.raises(Exception, match="encryption"):
        TorchDistributor(1, False, False).run(_workers.rank_times, 1)
    tls_cluster.set("pytorch.spark.distributor.ignoreSsl", "true")
    assert TorchDistributor(1, False, False).run(_workers.rank_times, 1) == 0
    tls_cluster.set("spark.ssl.enabled", "false")
    tls_cluster.set("pytorch.spark.distributor.ignoreSsl", "false")
    assert TorchDistributor(1, False, False).run(_workers.rank_times, 1) == 0
