"""hora on Spark standalone over 2 namespaced hosts x 2 slots: 4 ranks, 2 per host.

One conformance job runs every collective case of tests/collectives/_cases.py on the 4 ranks (each
test below asserts one case on every rank), on the hierarchical data path (shared memory within
each host, gloo across; `hierarchical_matches_flat` compares it with the flat path); one training
job compares hora.torch's DistributedOptimizer with one process. Each test names the hosts its
ranks ran on.
"""

from __future__ import annotations

from typing import Any

import pytest

import hora
from tests.cluster import _jobs
from tests.cluster._checks import assert_spread, assert_trained_like_one_process, placement_table
from tests.cluster.conftest import CORES, HOSTS, note, timed
from tests.collectives import _cases

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

NP = HOSTS * CORES


@pytest.fixture(scope="module")
def conformance(spark_cluster) -> list[dict[str, Any]]:
    with timed(f"spark: conformance job ({len(_cases.CASES)} cases, np={NP})"):
        results = hora.run(_jobs.conformance, np=NP, backend="spark", timeout=240)
    note(f"spark conformance placement: {placement_table([r['where'] for r in results])}")
    return results


@pytest.fixture(scope="module")
def trained(spark_cluster) -> list[dict[str, Any]]:
    with timed(f"spark: training job (np={NP})"):
        results = hora.run(_jobs.train, np=NP, backend="spark", timeout=240)
    note(f"spark training placement: {placement_table([r['where'] for r in results])}")
    return results


def test_ranks_are_spread_two_per_host(conformance):
    assert_spread([r["where"] for r in conformance], HOSTS, CORES)


def test_ranks_of_one_host_are_contiguous(conformance):
    places = [r["where"] for r in conformance]
    table = placement_table(places)
    hosts = [p["host"] for p in places]
    first_seen = list(dict.fromkeys(hosts))
    assert hosts == sorted(hosts, key=first_seen.index), f"not host-ordered: {table}"
    for p in places:  # rank = cross_rank * local_size + local_rank, as under horovodrun
        assert p["RANK"] == p["GROUP_RANK"] * p["LOCAL_WORLD_SIZE"] + p["LOCAL_RANK"], table


def test_allreduce_reduces_within_each_host_through_shared_memory(conformance):
    """The hierarchical path: shared memory among the ranks of each real host (each namespaced
    host has its own /dev/shm), gloo across."""
    places = [r["where"] for r in conformance]
    table = placement_table(places)
    hosts = [
        [p["RANK"] for p in places if p["host"] == h]
        for h in dict.fromkeys(p["host"] for p in places)
    ]
    assert all(r["hierarchy_hosts"] == hosts for r in conformance), (
        f"hierarchical path's hosts {[r['hierarchy_hosts'] for r in conformance]}; {table}"
    )
    calls = [(r["shm_allreduce_calls"], r["hierarchical_allreduce_calls"]) for r in conformance]
    assert all(c == (1, 1) for c in calls), (
        f"(shared-memory, hierarchical) allreduces {calls}; {table}"
    )


@pytest.mark.parametrize("case", list(_cases.CASES))
def test_case(conformance, case: str) -> None:
    table = placement_table([r["where"] for r in conformance])
    failures = {
        r["where"]["RANK"]: r["cases"][case] for r in conformance if r["cases"].get(case) != "ok"
    }
    assert not failures, f"ranks on {table}:\n" + "\n".join(
        f"rank {rank}: {text}" for rank, text in failures.items()
    )


def test_distributed_optimizer_equals_one_process(trained):
    assert_spread([r["where"] for r in trained], HOSTS, CORES)
    assert_trained_like_one_process(trained)
