"""The DeepSpeed door with real ranks: scripts and functions, dict and path configs, on the local
engine and a real local Spark; a failing rank; bad configs refused before launch."""

from __future__ import annotations

import glob
import json
import os
import tempfile

import pytest

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install hora[deepspeed])")

from hora.errors import HoraError
from hora.spark import DeepspeedTorchDistributor
from hora.spark._deepspeed_config import DeepspeedConfigError
from tests.deepspeed import _ranks

SCRIPT = _ranks.__file__
CONFIG = {
    "train_micro_batch_size_per_gpu": 8,
    "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}},
    "zero_optimization": {"stage": 2},
}


def _temp_configs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "hora-deepspeed-*")))


def _seen(out) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def _trained(seen: list[dict], stage: int, per_task: bool = False) -> None:
    """`per_task`: on Spark, where each rank is a task's one torchrun process (pyspark's)."""
    assert [s["rank"] for s in seen] == [0, 1]
    for s in seen:
        assert s["world"] == 2 and s["stage"] == stage
        # one host: LOCAL_RANK as the deepspeed launcher's; on Spark 0, as pyspark's
        assert s["local_rank"] == (0 if per_task else s["rank"])
        assert s["losses"][-1] < s["losses"][0]


def test_bad_configs_are_refused_before_launch(tmp_path):
    with pytest.raises(DeepspeedConfigError, match=r"'zero_optimisation' \(did you mean"):
        DeepspeedTorchDistributor(
            2, useGpu=False, deepspeedConfig={"zero_optimisation": {"stage": 2}}
        ).run(SCRIPT)
    with pytest.raises(DeepspeedConfigError, match="stage"):
        DeepspeedTorchDistributor(
            2, useGpu=False, deepspeedConfig={"zero_optimization": {"stage": 4}}
        ).run(SCRIPT)
    bad = tmp_path / "ds.json"
    bad.write_text("{'train_batch_size': 8}")
    with pytest.raises(DeepspeedConfigError, match="is not JSON"):
        DeepspeedTorchDistributor(2, useGpu=False, deepspeedConfig=str(bad))
    with pytest.raises(DeepspeedConfigError, match="no such DeepSpeed config"):
        DeepspeedTorchDistributor(2, useGpu=False, deepspeedConfig=str(tmp_path / "none.json"))
    with pytest.raises(DeepspeedConfigError, match="on 2 ranks"):  # 15 is not 2 ranks x 8
        DeepspeedTorchDistributor(
            2, useGpu=False, deepspeedConfig={**CONFIG, "train_batch_size": 15}
        ).run(SCRIPT)
    with pytest.raises(ValueError, match="numGpus"):
        DeepspeedTorchDistributor(0, useGpu=False)


def test_local_script_with_dict_then_path_config_and_function(tmp_path):
    before = _temp_configs()
    out = tmp_path / "dict"
    out.mkdir()
    DeepspeedTorchDistributor(numGpus=2, useGpu=False, deepspeedConfig=CONFIG).run(
        SCRIPT, "--out", str(out)
    )
    seen = _seen(out)
    _trained(seen, stage=2)
    for s in seen:
        assert s["argv"][-3:] == ["--deepspeed", "--deepspeed_config", s["config_path"]]
        assert s["config_existed"]
        assert not os.path.exists(s["config_path"])  # removed after the run
    assert _temp_configs() == before

    path = tmp_path / "ds.json"
    path.write_text(json.dumps({**CONFIG, "zero_optimization": {"stage": 3}}))
    out = tmp_path / "path"
    out.mkdir()
    DeepspeedTorchDistributor(1, nnodes=2, useGpu=False, deepspeedConfig=str(path)).run(
        SCRIPT, "--out", str(out)
    )
    seen = _seen(out)
    _trained(seen, stage=3)
    assert {s["config_path"] for s in seen} == {str(path)}  # the user's own file, kept
    assert path.exists()

    out = tmp_path / "function"
    out.mkdir()
    config = {**CONFIG, "zero_optimization": {"stage": 1}}
    result = DeepspeedTorchDistributor(2, useGpu=False, deepspeedConfig=config).run(
        _ranks.function, str(out)
    )
    assert result["rank"] == 0 and result["config"] == config
    _trained(_seen(out), stage=1)


def test_failing_rank_fails_the_run_and_removes_the_config(tmp_path):
    before = _temp_configs()
    with pytest.raises(HoraError, match="rank 1 fails on purpose"):
        DeepspeedTorchDistributor(2, useGpu=False, deepspeedConfig=CONFIG).run(
            SCRIPT, "--out", str(tmp_path), "--fail-rank", "1"
        )
    assert _temp_configs() == before
