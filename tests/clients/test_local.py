"""Client code in hora's local doors against torchrun: the same ranks, losses and weights.

One job per client family (Lightning's Trainer and Fabric; Hugging Face's Accelerate and
Trainer; Horovod's fp16 loop), each run once under `torchrun --standalone --nproc_per_node=2`
and once in the door its users would reach for.
"""

from __future__ import annotations

import json

import pytest

import hora
from hora.spark import TorchDistributor
from tests.clients import _train
from tests.clients.conftest import results, torchrun

pytestmark = pytest.mark.clients
pytest.importorskip("lightning")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")


def test_lightning_trainer_and_fabric_as_under_torchrun(tmp_path):
    """`devices=2, num_nodes=1` (the layout of one machine); Lightning reads torchrun's
    environment (TorchElasticEnvironment) under both."""
    layouts = [(2, 1)]
    done = torchrun("lightning", tmp_path / "torchrun", json.dumps(layouts))
    assert done.returncode == 0, done.stderr[-4000:]
    door = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False)
    door.run(_train.lightning, str(tmp_path / "hora"), layouts)
    ours, reference = (
        results(tmp_path / "hora", "lightning"),
        results(tmp_path / "torchrun", "lightning"),
    )
    assert ours == reference
    for rank, seen in enumerate(ours):
        for case in seen.values():
            assert case["environment"] == "TorchElasticEnvironment"
            assert case["ranks"] == [rank, rank, 0, 2]


def test_lightning_tasks_as_nodes_fail_on_one_machine_as_under_torchrun(tmp_path):
    """`devices=1, num_nodes=2` is the layout of one process per Spark task: on one machine
    (torchrun --standalone, pyspark's local mode) rank 1 is LOCAL_RANK 1 of one device, and
    Lightning fails with IndexError under torchrun and hora alike."""
    layouts = json.dumps([(1, 2)])
    done = torchrun("lightning", tmp_path / "torchrun", layouts)
    assert done.returncode != 0 and "IndexError" in done.stderr
    with pytest.raises(RuntimeError, match="IndexError"):
        hora.run(_train.lightning, (str(tmp_path / "hora"), [(1, 2)]), np=2)


def test_hugging_face_accelerate_and_trainer_as_under_torchrun(tmp_path):
    done = torchrun("huggingface", tmp_path / "torchrun")
    assert done.returncode == 0, done.stderr[-4000:]
    door = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False)
    door.run(_train.huggingface, str(tmp_path / "hora"))
    ours = results(tmp_path / "hora", "huggingface")
    assert ours == results(tmp_path / "torchrun", "huggingface")
    for rank, seen in enumerate(ours):
        assert seen["accelerate"]["ranks"] == [rank, rank, 2]
        assert seen["trainer"]["ranks"] == [rank, rank, 2]
        assert len(seen["trainer"]["losses"]) == _train.STEPS


def test_horovod_fp16_loop_as_under_torchrun(tmp_path):
    done = torchrun("horovod_fp16", tmp_path / "torchrun")
    assert done.returncode == 0, done.stderr[-4000:]
    hora.HorovodRunner(np=-2).run(_train.horovod_fp16, out=str(tmp_path / "hora"))
    ours = results(tmp_path / "hora", "horovod_fp16")
    assert ours == results(tmp_path / "torchrun", "horovod_fp16")
    assert [seen["ranks"] for seen in ours] == [[0, 0, 2], [1, 1, 2]]
    assert ours[0]["weights"] == ours[1]["weights"]
