"""hora at real scale on Ray: 8 namespaced hosts, one 4-CPU Ray node each, 32 ranks (issue 45).

One job on a cluster of its own (Ray only: 8 Ray nodes beside 8 Spark workers would not leave
this machine the memory of 32 ranks): every op kind checked on every rank on the hierarchical
path, the ranks numbered host by host (PACK fills one node, then the next), then hora.torch's
DistributedOptimizer trains and every rank ends with the weights of one process.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster import _scale_jobs
from tests.cluster._checks import assert_trained_like_one_process
from tests.cluster.conftest import ray_on_hosts
from tests.ray.conftest import live_actors, live_placement_groups

# slow (`make test-slow`), as the Spark module (test_scale.py) is
pytestmark = [pytest.mark.cluster, pytest.mark.ray, pytest.mark.slow]

HOSTS, CORES = _scale_jobs.HOSTS, _scale_jobs.CORES
JOB_TIMEOUT = 600.0


@pytest.fixture(scope="module")
def every_op_and_trained() -> Iterator[list[dict[str, Any]]]:
    """A Ray head (no CPUs) on the bridge and a 4-CPU Ray node on each of 8 hosts; the job."""
    with ray_on_hosts(HOSTS, CORES):
        yield _scale_jobs.run_every_op_then_train("ray", JOB_TIMEOUT)


def test_32_ranks_on_8_ray_nodes_train_right_on_the_hierarchical_path(every_op_and_trained):
    places = [r["where"] for r in every_op_and_trained]
    _scale_jobs.assert_numbered_host_by_host(places)  # PACK: one node filled, then the next
    _scale_jobs.assert_every_op_right(every_op_and_trained)
    assert_trained_like_one_process(every_op_and_trained)
    assert not live_actors() and not live_placement_groups()
