"""`@distributed(..., remote=True)` on the active Spark session (real local Spark, `local[2]`):
every rank's value in rank order from a barrier stage, the remote exception raised."""

from __future__ import annotations

import os

import pytest

from hora import distributed
from hora.errors import RankTraceback
from tests.spark.conftest import start_spark, stop_spark

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark():
    session = start_spark("local[2]")
    yield session
    stop_spark(session)


class Diverged(Exception):
    pass


@distributed(gpus=2, gpu_type="H100", remote=True)  # the cluster's GPUs: Databricks' own words
def train(scale):
    from pyspark import BarrierTaskContext

    task = BarrierTaskContext.get().partitionId()  # a Spark task's rank
    if scale < 0:
        raise Diverged(f"rank {os.environ['RANK']}: scale {scale}")
    return int(os.environ["RANK"]) * scale, int(os.environ["WORLD_SIZE"]), task


def test_remote_runs_on_the_active_spark_session(spark):
    results = train.distributed(10)
    assert [(value, size) for value, size, _ in results] == [(0, 2), (10, 2)]
    assert sorted(task for _, _, task in results) == [0, 1]


def test_remote_raises_the_rank_s_exception(spark):
    with pytest.raises(Diverged, match="scale -1") as info:
        train.distributed(-1)
    assert isinstance(info.value.__cause__, RankTraceback)
    assert "in train" in info.value.__cause__.text
