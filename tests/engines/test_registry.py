"""The engine registry: every door asks it, and bad input fails before anything starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

import hora
from hora import engines
from hora.config import RunConfig
from tests import _workers


def test_every_engine_declares_itself_and_auto_falls_back_to_this_machine():
    assert set(engines.names()) == {"local", "spark", "ray"}
    assert engines.get("local").ranks_run is engines.RanksRun.HERE
    assert engines.get("ray").ranks_run is engines.RanksRun.ON_CLUSTER
    assert set(engines.get("ray").options) == {
        "placement_strategy",
        "num_cpus_per_rank",
        "num_gpus_per_rank",
    }
    assert engines.resolve("auto") == "local"  # no SparkSession, no ray.init() in this process


def test_bad_backend_or_options_fail_in_the_config_with_what_to_change():
    with pytest.raises(ValueError, match=r"backend must be one of \('spark', 'ray', 'local'\)"):
        RunConfig(np=2, backend="yarn")
    with pytest.raises(ValueError, match=r"not options of the 'local' engine \(it takes: none\)"):
        hora.run(_workers.rank_times, (1,), np=2, backend="local", engine_options={"x": 1})
    with pytest.raises(ValueError, match="num_cpus_per_rank must be a number >= 0"):
        RunConfig(np=2, backend="ray", engine_options={"num_cpus_per_rank": "two"})
    config = RunConfig(np=2, backend="ray", engine_options={"placement_strategy": "spread"})
    assert config.engine_options == {
        "placement_strategy": "SPREAD",
        "num_cpus_per_rank": 1,
        "num_gpus_per_rank": 0,
    }


def test_spark_options_are_checked_and_completed_without_pyspark():
    assert RunConfig(np=2, backend="spark").engine_options == {
        "gpu_resource": "gpu",
        "task_gpu_counts": None,
        "ignore_ssl_key": "pytorch.spark.distributor.ignoreSsl",
    }
    with pytest.raises(ValueError, match="task_gpu_counts must be a list of counts >= 0"):
        RunConfig(np=2, backend="spark", engine_options={"task_gpu_counts": [1, -1]})
    with pytest.raises(ValueError, match="gpu_resource must be a Spark resource name"):
        RunConfig(np=2, backend="spark", engine_options={"gpu_resource": ""})


def test_the_engine_authors_face_lists_what_it_has_and_loads_no_framework():
    """`hora.engines` is all an engine author imports (docs/engines.md); importing it, and
    reading every engine's declaration, loads neither pyspark, ray nor torch."""
    code = (
        "import sys\n"
        "import hora.engines as face\n"
        "face.names(), face.broken()\n"
        "print([n for n in face.__all__ if not hasattr(face, n)])\n"
        "print([m for m in ('pyspark', 'ray', 'torch') if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == ["[]", "[]"]
    wanted = {"Launcher", "AttemptSpec", "LaunchContext", "Boot", "Output", "Exited"}
    wanted |= {"EngineFailed", "placements", "worker_env", "WorkerProcess", "stop_all"}
    wanted |= {"host_store", "supervised_worker", "hora_zip", "rank_pythonpath", "most_ranks"}
    assert wanted <= set(engines.__all__)


def test_the_most_ranks_of_a_run_are_said_in_one_place():
    assert engines.most_ranks(2, None) == 2 and engines.most_ranks(2, 4) == 4
    assert RunConfig(np=2, max_np=4).most_ranks == engines.AttemptSpec(np=2, max_np=4).most_ranks
