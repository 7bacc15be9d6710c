"""Databricks' serverless GPU API as a door (`from hora import distributed`), on real processes.

This machine has no GPU: `remote=False` runs `gpus` CPU ranks here, as the door promises; a GPU
type it cannot honour is refused before anything starts.
"""

from __future__ import annotations

import os
import traceback

import pytest

import hora
from hora import distributed
from hora.errors import RankTraceback
from hora.serverless import local_gpus

needs_no_gpu = pytest.mark.skipif(bool(local_gpus()), reason="this machine has GPUs")


# As Databricks' example writes it, but for CPUs: gloo instead of nccl, no set_device.
@distributed(gpus=2, gpu_type=None, remote=False)
def run_train(steps: int, scale: float = 1.0):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1) * scale])
    for _ in range(steps):
        dist.all_reduce(value)
    dist.destroy_process_group()
    env = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
    return env, value.item()


@needs_no_gpu
def test_fn_distributed_returns_every_rank_s_value_in_rank_order():
    results = run_train.distributed(2, scale=0.5)
    assert [env["RANK"] for env, _ in results] == ["0", "1"]
    assert all(env["WORLD_SIZE"] == "2" for env, _ in results)
    assert [env["LOCAL_RANK"] for env, _ in results] == ["0", "1"]
    assert [value for _, value in results] == [3.0, 3.0]  # (0.5 + 1.0), reduced twice: 1.5 * 2


def test_the_decorated_function_is_still_itself():
    @distributed(gpus=2)
    def add(a, b):
        return a + b

    assert add(1, 2) == 3 and add.__name__ == "add"


@needs_no_gpu
def test_databricks_air_names_are_the_same_door():
    @distributed(num_accelerators=2, accelerator_type=None)
    def rank():
        return int(os.environ["RANK"])

    assert rank.distributed() == [0, 1]


class Diverged(Exception):
    pass


@needs_no_gpu
def test_the_remote_exception_is_raised_with_the_rank_s_traceback_first():
    @distributed(gpus=2)
    def diverge(limit):
        if os.environ["RANK"] == "1":
            raise Diverged(f"loss above {limit}")
        return "fine"

    with pytest.raises(Diverged, match="loss above 10") as info:
        diverge.distributed(10)
    cause = info.value.__cause__
    assert isinstance(cause, RankTraceback) and cause.rank == 1
    assert "in diverge" in cause.text and 'raise Diverged(f"loss above {limit}")' in cause.text
    printed = "".join(traceback.format_exception(info.value))
    assert printed.index("rank 1 raised") < printed.index("Diverged: loss above 10")
    assert "hora: rank 1 failed: Diverged: loss above 10" in printed


@needs_no_gpu
def test_a_gpu_type_this_machine_cannot_honour_is_refused_before_launch():
    @distributed(gpus=2, gpu_type="H100")
    def never():
        raise AssertionError("must not run")

    with pytest.raises(ValueError, match=r"gpu_type='H100': this machine has no GPU"):
        never.distributed()


@needs_no_gpu
def test_no_gpu_and_no_count_says_how_many_cpu_ranks():
    @distributed
    def never():
        raise AssertionError("must not run")

    with pytest.raises(ValueError, match="say how many CPU ranks"):
        never.distributed()


def test_bad_arguments_are_refused_at_the_decorator():
    with pytest.raises(ValueError, match="not a GPU type hora knows"):
        distributed(gpus=2, gpu_type="Z80")
    with pytest.raises(ValueError, match="GPU_<count>x<type>"):
        distributed(num_accelerators=8, accelerator_type="8 H100s")
    with pytest.raises(ValueError, match="not both"):
        distributed(gpus=8, num_accelerators=8)
    with pytest.raises(ValueError, match="positive int"):
        distributed(gpus=0)
    with pytest.raises(ValueError, match=r"does not take \['np'\]"):
        distributed(gpus=2, np=2)
    assert distributed(num_accelerators=8, accelerator_type="GPU_8xH100")  # known: accepted


def test_remote_without_a_cluster_is_a_clear_error():
    @distributed(gpus=2, gpu_type="H100", remote=True)
    def never():
        raise AssertionError("must not run")

    with pytest.raises(RuntimeError, match=r"create a SparkSession .* or call ray\.init"):
        never.distributed()


def test_the_package_exports_it():
    assert hora.distributed is distributed and "distributed" in hora.__all__
