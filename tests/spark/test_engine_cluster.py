"""The Spark engine on `local-cluster[2,1,1024]`: two executor JVMs, each with one (fake) GPU.

The GPUs are Spark resources found by a discovery script that hands each worker its own address;
the executors see CUDA_VISIBLE_DEVICES=5,6,7,8, so address `i` is CUDA device `5 + i` there. No
CUDA is needed to check that each rank's CUDA_VISIBLE_DEVICES follows Spark's assignment.
Also the TorchDistributor door (function and script), on this cluster and in local mode.
"""

from __future__ import annotations

import queue
import textwrap
import time

import pytest

import hora
from hora.config import RunConfig
from hora.engines.base import AttemptSpec, LaunchContext
from hora.engines.spark.launcher import SparkLauncher
from hora.spark import TorchDistributor
from hora.wire import channel as _channel
from hora.wire.protocol import ALLOWED, EngineFailed, Hello, Refuse, TaskReady
from tests import _workers
from tests.spark import _jobs
from tests.spark.conftest import fake_gpus, start_spark, stop_spark

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    script = fake_gpus(tmp_path_factory.mktemp("gpus"), ["0"], ["1"], ["2"], ["3"])
    session = start_spark(
        "local-cluster[2,1,1024]",
        **{
            "spark.worker.resource.gpu.amount": "1",
            "spark.worker.resource.gpu.discoveryScript": script,
            "spark.executor.resource.gpu.amount": "1",
            "spark.task.resource.gpu.amount": "1",
            "spark.executorEnv.CUDA_VISIBLE_DEVICES": "5,6,7,8",
        },
    )
    yield session
    stop_spark(session)


def test_results_from_two_executors(spark):
    assert hora.run(_workers.rank_times, (7,), np=2, backend="spark") == [0, 7]
    ranks_pids = hora.run(_jobs.whoami, np=2)
    assert [r for r, _pid, _host in ranks_pids] == [0, 1]


def test_env_contract_equals_local_mode(spark):
    env = {"USER_VAR": "x"}
    assert hora.run(_jobs.contract, np=2, backend="spark", env=env) == hora.run(
        _jobs.contract, np=2, backend="local", env=env
    )


def test_gloo_across_executors(spark):
    assert hora.run(_workers.gloo_allreduce, np=2, backend="spark") == [3.0, 3.0]


def test_each_rank_sees_its_task_gpu_at_local_rank(spark):
    seen = hora.run(_jobs.visible_gpus, np=2, backend="spark")
    lists = [visible.split(",") for visible, _ in seen]
    assert lists[0] == lists[1] and sorted(lists[0]) == ["5", "6"]  # this job's GPUs on the host
    own = [gpus[int(local_rank)] for gpus, (_, local_rank) in zip(lists, seen, strict=True)]
    assert sorted(own) == ["5", "6"]  # cuda:LOCAL_RANK is a different GPU for each rank


def test_torch_distributor_rank_sees_only_its_own_gpu_at_local_rank_0(spark):
    """As pyspark's torchrun per task: LOCAL_RANK 0 and the task's GPU alone, so cuda:0 is the
    rank's own; hora's own numbering (hvd.local_rank()) still counts the host's ranks."""
    views = TorchDistributor(num_processes=2, local_mode=False, use_gpu=True).run(
        _jobs.torchrun_view
    )
    assert sorted(v["CUDA_VISIBLE_DEVICES"] for v in views) == ["5", "6"]
    assert [(v["LOCAL_RANK"], v["GROUP_RANK"]) for v in views] == [("0", "0"), ("0", "1")]
    assert [v["hvd"][1:3] for v in views] == [(0, 2), (1, 2)]


def test_use_gpu_false_hides_the_executor_s_gpus(spark):
    """As pyspark's tasks do: CPU training on a GPU host sees no GPU (issue 26)."""
    seen = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        _jobs.visible_gpus
    )
    assert seen[0] == ""


def test_failing_rank_on_another_executor(spark):
    start = time.monotonic()
    with pytest.raises(hora.WorkerFailedError) as info:
        hora.run(_jobs.fail_after_peer_started, (0,), np=2, backend="spark")
    assert time.monotonic() - start < 20
    assert str(info.value).startswith("rank 0 failed: RuntimeError: deliberate failure on rank 0")


def test_torch_distributor_function(spark):
    distributor = TorchDistributor(num_processes=2, local_mode=False, use_gpu=True)
    assert distributor.run(_workers.rank_times, 5) == 0  # rank 0's value
    assert distributor.run(_workers.gloo_allreduce) == 3.0


def test_torch_distributor_script_gets_torchrun_env_and_args(spark, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent("""\
        import os, sys
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.ones(1) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        out = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"out-{os.environ['RANK']}")
        with open(out, "w") as f:
            f.write(" ".join([__name__, os.environ["WORLD_SIZE"], str(t.item()), *sys.argv[1:]]))
        """)
    )
    result = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        str(script), "--lr", "0.1"
    )
    assert result is None
    for rank in (0, 1):
        assert (tmp_path / f"out-{rank}").read_text() == "__main__ 2 3.0 --lr 0.1"


def test_torch_distributor_local_mode_runs_on_the_driver(spark):
    distributor = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False)
    assert distributor.run(_workers.rank_times, x=3) == 0
    assert distributor.run(_workers.gloo_allreduce) == 3.0


def test_torch_distributor_argument_errors(spark, tmp_path):
    with pytest.raises(ValueError, match="num_processes"):
        TorchDistributor(num_processes=0)
    script = tmp_path / "s.py"
    script.write_text("")
    with pytest.raises(ValueError, match="keyword arguments"):
        TorchDistributor(num_processes=1, local_mode=False, use_gpu=False).run(str(script), lr=1)
    with pytest.raises(RuntimeError, match="GPUs were unable to be found on the driver"):
        TorchDistributor(num_processes=1, local_mode=True, use_gpu=True)  # as pyspark refuses


def test_a_rank_is_never_started_twice(spark):
    """If Spark re-attempts a task, its supervisor is refused and the job is failed instead."""
    events: queue.Queue = queue.Queue()
    secret = _channel.new_secret()
    # The workers dial it; nobody sends a payload.
    job_channel = _channel.Server(secret, events, ALLOWED)
    config = RunConfig(np=1, backend="spark")
    launcher = SparkLauncher(AttemptSpec(np=1, options=config.engine_options))
    launcher.start(LaunchContext(job_channel.address, secret, events))
    try:
        _wait_for(events, lambda m: isinstance(m, Hello))  # rank 0 is running
        # What a re-attempt does:
        again = _channel.connect(launcher._server.address, secret, ALLOWED)
        again.send(TaskReady(0, {"attempt": 1, "stage": 0}))
        reply = again.recv()
        again.close()
        assert isinstance(reply, Refuse) and "second time" in reply.reason
        failed = _wait_for(events, lambda m: isinstance(m, EngineFailed))
        assert failed.rank == 0 and "re-attempted" in failed.summary
    finally:
        launcher.stop()
        job_channel.close()


def _wait_for(events: queue.Queue, match, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _conn, message = events.get(timeout=0.5)
        except queue.Empty:
            continue
        if message and match(message):
            return message
    raise AssertionError("the expected event never came")


def test_mirrored_strategy_runner_across_executors(spark):
    pytest.importorskip("tensorflow")
    from hora.spark import MirroredStrategyRunner
    from tests.spark._tf_jobs import EXPECTED, train

    assert MirroredStrategyRunner(num_slots=2, use_gpu=False).run(train, scale=2.0) == EXPECTED
