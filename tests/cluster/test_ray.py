"""hora on Ray over 2 namespaced hosts: a head with no CPUs on the bridge, one 2-CPU node per
host, this process the driver (test_elastic.py's cluster, kept: Spark standalone idles beside
Ray). A training job (4 ranks, 2 per host) and a host cut off mid-collective."""

from __future__ import annotations

import pytest

import hora
from tests.cluster import _jobs
from tests.cluster._checks import (
    JOB_TIMEOUT,
    assert_spread,
    assert_trained_like_one_process,
    cut_off_mid_collective,
    placement_table,
)
from tests.cluster.conftest import CORES, HOSTS, make_whole, note, timed

pytestmark = [pytest.mark.cluster, pytest.mark.ray]

NP = HOSTS * CORES


@pytest.fixture
def cluster(spark_and_ray_cluster):
    yield spark_and_ray_cluster
    make_whole(spark_and_ray_cluster)


def test_training_over_two_ray_nodes_equals_one_process(cluster):
    """PACK (the default) fills one node, then the next: each host's ranks are contiguous."""
    with timed(f"ray: training job (np={NP})"):
        results = hora.run(_jobs.train, np=NP, backend="ray", timeout=JOB_TIMEOUT)
    places = [r["where"] for r in results]
    note(f"ray training placement: {placement_table(places)}")
    assert_spread(places, HOSTS, CORES)
    hosts = [p["host"] for p in places]
    assert hosts == sorted(hosts, key=hosts.index), placement_table(places)
    assert [p["LOCAL_RANK"] for p in places] == [0, 1] * HOSTS, placement_table(places)
    assert_trained_like_one_process(results)


def test_a_host_cut_off_mid_collective_is_reported_within_60s_naming_it(cluster, tmp_path):
    cut = cut_off_mid_collective(cluster, tmp_path, "ray", NP)
    note(f"ray cut-off: {cut}")
    cut.assert_reported_in_time_naming_the_host()
