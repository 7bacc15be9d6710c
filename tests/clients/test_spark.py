"""Lightning on Spark (`local[2]`): hora's TorchDistributor against pyspark's own, both layouts.

`devices=1, num_nodes=2` is Databricks' TorchDistributor + Lightning example for
local_mode=False (tasks as nodes); `devices=2, num_nodes=1` the one-machine layout. pyspark runs
one torchrun per task; hora's ranks see the same (issue 31: main failed the first layout with
IndexError on rank 1).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from hora.spark import TorchDistributor
from tests.clients import _train
from tests.clients.conftest import results, with_repo_on_path

pytest.importorskip("lightning")
from tests.spark.conftest import end_spark_jvm, start_spark, stop_spark

pytestmark = [pytest.mark.clients, pytest.mark.spark]

LAYOUTS = [(2, 1), (1, 2)]


@pytest.fixture(scope="module")
def spark():
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = with_repo_on_path(dict(os.environ))["PYTHONPATH"]  # pyspark's tasks
    session = start_spark("local[2]")
    yield session
    stop_spark(session)
    end_spark_jvm()
    if before is None:
        del os.environ["PYTHONPATH"]
    else:
        os.environ["PYTHONPATH"] = before


@pytest.mark.timeout(900)  # room for the reference's second run (below)
def test_lightning_both_layouts_as_under_pyspark(spark, tmp_path):
    from pyspark.ml.torch.distributor import TorchDistributor as PysparkTorchDistributor

    out = {name: str(tmp_path / name) for name in ("pyspark", "hora")}
    for attempt in range(2):
        # The reference is run again once if it fails: torch's gloo teardown now and then aborts
        # a rank of pyspark's own torchrun on this 2-core machine (conftest.TORN_DOWN), and the
        # other rank's torchrun then waits out its 300 s exit barrier; torch's flake, not hora's.
        try:
            PysparkTorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
                _train.lightning, out["pyspark"], LAYOUTS
            )
            break
        except Exception:
            if attempt:
                raise
            shutil.rmtree(out["pyspark"], ignore_errors=True)
    TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        _train.lightning, out["hora"], LAYOUTS
    )
    ours = results(tmp_path / "hora", "lightning")
    assert ours == results(tmp_path / "pyspark", "lightning")
    for rank, seen in enumerate(ours):
        assert sorted(seen) == sorted(
            f"{api} {d}x{n}" for api in ("trainer", "fabric") for d, n in LAYOUTS
        )
        for case in seen.values():
            assert case["environment"] == "TorchElasticEnvironment"
            assert case["ranks"] == [rank, 0, rank, 2], json.dumps(seen)
