"""The DeepSpeed door on a real local Spark (`local[2]`): a script with a dict config, each rank
writing and removing its own copy, and a function with a path config."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install hora[deepspeed])")

from hora.spark import DeepspeedTorchDistributor
from tests.deepspeed import _ranks
from tests.deepspeed.test_door import CONFIG, SCRIPT, _seen, _trained


@pytest.mark.spark
def test_spark_local2_script_and_function(tmp_path):
    from tests.spark.conftest import start_spark, stop_spark

    spark = start_spark("local[2]")
    try:
        out = tmp_path / "script"
        out.mkdir()
        DeepspeedTorchDistributor(2, localMode=False, useGpu=False, deepspeedConfig=CONFIG).run(
            SCRIPT, "--out", str(out)
        )
        seen = _seen(out)
        _trained(seen, stage=2, per_task=True)
        for s in seen:  # each rank wrote its own copy (executors do not see the driver's files)
            assert s["config_existed"] and not os.path.exists(s["config_path"])
        path = tmp_path / "ds.json"
        path.write_text(json.dumps(CONFIG))
        out = tmp_path / "function"
        out.mkdir()
        result = DeepspeedTorchDistributor(
            2, localMode=False, useGpu=False, deepspeedConfig=str(path)
        ).run(_ranks.function, str(out))
        assert result["config"] == CONFIG  # a path config reaches a function as its dict
        _trained(_seen(out), stage=2, per_task=True)
    finally:
        stop_spark(spark)
