"""Refusals before launch, each on a real SparkSession configured for it (one per case)."""

from __future__ import annotations

import pytest

import hora
from tests import _workers
from tests.spark.conftest import start_spark, stop_spark

pytestmark = pytest.mark.spark


@pytest.fixture
def session(request):
    master, conf = request.param
    spark = start_spark(master, **conf)
    yield spark
    stop_spark(spark)


@pytest.mark.parametrize(
    "session",
    [
        (
            "local-cluster[2,1,1024]",
            {
                "spark.dynamicAllocation.enabled": "true",
                "spark.dynamicAllocation.shuffleTracking.enabled": "true",
            },
        )
    ],
    indirect=True,
)
def test_dynamic_allocation_is_refused_with_what_to_change(session):
    with pytest.raises(ValueError, match=r"spark.dynamicAllocation.enabled=false"):
        hora.Runner(np=2).run(_workers.rank_times, x=1)


@pytest.mark.parametrize("session", [("local[2]", {"spark.ssl.enabled": "true"})], indirect=True)
def test_ssl_cluster_refuses_unencrypted_training_unless_told(session):
    with pytest.raises(RuntimeError, match=r"not encrypted.*spark.hora.ignoreSsl"):
        hora.Runner(np=2).run(_workers.rank_times, x=1)


@pytest.mark.parametrize(
    "session",
    [("local[2]", {"spark.ssl.enabled": "true", "pytorch.spark.distributor.ignoreSsl": "true"})],
    indirect=True,
)
def test_ssl_opt_in_of_pyspark_is_honoured(session):
    assert hora.run(_workers.rank_times, (2,), np=2, backend="spark") == [0, 2]
