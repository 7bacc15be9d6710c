"""FSDP2, pipeline parallelism and DeepSpeed's launcher contract under hora's doors, for real.

The examples are torchrun/deepspeed scripts, run unchanged by `hora run` (the CLI), `hora.run`
and TorchDistributor; the losses they write are compared, not just their exit codes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hora import Runner
from hora._script import run_script
from hora.spark import TorchDistributor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FSDP = os.path.join(ROOT, "examples", "fsdp_train.py")
PIPELINE = os.path.join(ROOT, "examples", "pipeline_parallel.py")
DEEPSPEED = os.path.join(ROOT, "examples", "deepspeed_train.py")
STEPS = "30"


def _losses(path) -> list[float]:
    with open(path) as f:
        return json.load(f)


def test_fsdp2_resumed_from_sharded_checkpoint_has_ddps_loss_curve(tmp_path):
    """One FSDP2 run whose last rank SIGKILLs itself at step 23: the restart loads the sharded
    checkpoint of step 20, and the whole loss curve (steps before the kill come from the
    checkpoint) equals DDP's on the same data, uninterrupted."""
    common = ["--steps", STEPS, "--save-every", "10"]
    ddp, fsdp = tmp_path / "ddp.json", tmp_path / "fsdp.json"
    TorchDistributor(2, use_gpu=False).run(FSDP, *common, "--ddp", "--losses", str(ddp))
    assert len(_losses(ddp)) == int(STEPS)
    assert _losses(ddp)[-1] < 0.5 * _losses(ddp)[0]

    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "hora", "run", "-np", "2", "--max-restarts", "1", FSDP, *common,
         "--checkpoint-dir", str(checkpoints), "--die-at-step", "23", "--losses", str(fsdp)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rank 1 kills itself at step 23" in done.stdout
    assert "resumed from step-20 (sharded checkpoint)" in done.stdout
    shards = sorted(os.listdir(checkpoints / "step-20"))
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # one file per rank
    assert _losses(fsdp) == pytest.approx(_losses(ddp), rel=1e-4, abs=1e-5)


def test_fsdp2_script_under_runner_and_pipeline_example_trains(tmp_path):
    fsdp, pipeline = tmp_path / "fsdp.json", tmp_path / "pipeline.json"
    Runner(np=-2).run(run_script, path=FSDP, argv=["--steps", "10", "--losses", str(fsdp)])
    assert len(_losses(fsdp)) == 10
    TorchDistributor(2, use_gpu=False).run(PIPELINE, "--steps", STEPS, "--losses", str(pipeline))
    curve = _losses(pipeline)
    assert len(curve) == int(STEPS)
    assert sum(curve[-5:]) / 5 < 0.5 * sum(curve[:5]) / 5


def test_deepspeed_script_runs_unchanged_under_hora_run(tmp_path):
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 8,
        "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}},
        "zero_optimization": {"stage": 3},
    }))  # fmt: skip
    losses = tmp_path / "losses.json"
    done = subprocess.run(
        [sys.executable, "-m", "hora", "run", "-np", "2", DEEPSPEED, "--steps", "20",
         "--deepspeed", "--deepspeed_config", str(config), "--losses", str(losses)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "deepspeed ZeRO-3 on 2 ranks" in done.stdout
    curve = _losses(losses)
    assert curve[-1] < curve[0]
