"""DeepSpeed's `AdamW` config on a real local Spark (`local[2]`): its ranks load the `fused_adam`
op the first run built (tests/deepspeed/conftest.py) from the executor's cache, building nothing."""

from __future__ import annotations

import pytest

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install hora[deepspeed])")

from hora.spark import DeepspeedTorchDistributor
from tests.deepspeed.conftest import ADAMW, BUILD_TIMEOUT, BuiltCache
from tests.deepspeed.test_door import SCRIPT, _seen, _trained


@pytest.mark.spark
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_spark_local2_adamw_trains_on_the_built_op(fused_adam_cache: BuiltCache, capfd, tmp_path):
    from tests.spark.conftest import start_spark, stop_spark

    built_at = fused_adam_cache.built_op.stat().st_mtime_ns
    capfd.readouterr()  # the first (building) run's output, if this test asked for it first
    cache = {"spark.executorEnv.TORCH_EXTENSIONS_DIR": str(fused_adam_cache.folder)}
    spark = start_spark("local[2]", **cache)
    try:
        DeepspeedTorchDistributor(2, localMode=False, useGpu=False, deepspeedConfig=ADAMW).run(
            SCRIPT, "--out", str(tmp_path)
        )
    finally:
        stop_spark(spark)
    output = capfd.readouterr().out
    assert "hora: building" not in output and "hora: waiting" not in output, output
    assert fused_adam_cache.built_op.stat().st_mtime_ns == built_at
    _trained(_seen(tmp_path), stage=2, per_task=True)
