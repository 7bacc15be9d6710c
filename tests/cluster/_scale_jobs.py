"""The 8-host cluster's shape (tests/cluster/test_scale.py, test_scale_ray.py) and what its ranks
run: one job that checks every op kind on the hierarchical path and then trains, so that 32
ranks start once for both (each start is 32 torch imports on this machine's 2 cores); on Spark
that job's first world goes on to the elastic run (`every_op_then_elastic`), for the same
reason."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

from tests.cluster import _jobs
from tests.scale import _every_op

HOSTS, CORES = 8, 4
NP = HOSTS * CORES


def ranks_by_host(places: list[dict[str, Any]]) -> list[list[int]]:
    """The ranks of each host, hosts in the order of their first rank: the hierarchical path's
    grouping of a job whose ranks are numbered host by host."""
    hosts = dict.fromkeys(p["host"] for p in places)
    return [[p["RANK"] for p in places if p["host"] == h] for h in hosts]


def assert_numbered_host_by_host(places: list[dict[str, Any]]) -> None:
    """HOSTS hosts of CORES ranks each, every host's ranks contiguous, and rank = cross rank x
    local size + local rank, as under horovodrun."""
    from tests.cluster._checks import assert_spread, placement_table

    table = placement_table(places)
    assert_spread(places, HOSTS, CORES)
    hosts = [p["host"] for p in places]
    assert hosts == sorted(hosts, key=hosts.index), table
    for p in places:
        assert p["RANK"] == p["GROUP_RANK"] * CORES + p["LOCAL_RANK"], table


def assert_every_op_right(results: list[dict[str, Any]]) -> None:
    """Each op kind right on every rank, and the hierarchical path grouped the ranks by their
    real host (`allreduce_path` checked that each rank's allreduce took it)."""
    ops = [r["ops"] for r in results]
    failed = _every_op.failures(ops)
    assert not failed, "\n".join(f"rank {r}, {case}: {text}" for (r, case), text in failed.items())
    by_host = ranks_by_host([r["where"] for r in results])
    assert all(o["hierarchy_hosts"] == by_host for o in ops), [o["hierarchy_hosts"] for o in ops]


def run_every_op_then_train(backend: str, timeout: float) -> list[dict[str, Any]]:
    """`every_op_then_train` on NP ranks of `backend`, its time and placement noted."""
    import hora
    from tests.cluster._checks import placement_table
    from tests.cluster.conftest import note, timed

    with timed(f"scale {backend}: every op, then training (np={NP}), run() to results"):
        results = hora.run(every_op_then_train, np=NP, backend=backend, timeout=timeout)
    note(f"scale {backend} placement: {placement_table([r['where'] for r in results])}")
    mean = results[0]["ops"]["allreduce_s"] * 1000
    note(f"  scale {backend}: an allreduce of 4 KB at {NP} ranks {mean:.1f} ms (rank 0's mean)")
    return results


def every_op_then_train() -> dict[str, Any]:
    """`_every_op.every_op` (each op kind checked on this rank, the hierarchy's hosts), then
    `_jobs.train` (hora.torch's DistributedOptimizer, its weights to compare with one
    process)."""
    ops = _every_op.every_op()
    trained = _jobs.train()
    return trained | {"ops": ops}


FIRST_WORLD = "first-world-{rank}.pickle"  # in the elastic plan's folder


def every_op_then_elastic(plan: Any) -> dict[str, Any]:
    """In the job's first world, `every_op_then_train` on every rank, its result written to the
    plan's folder (the host lost later takes its ranks' results with it); then the elastic run
    (`tests.elastic._jobs.train`), which a rank started to grow the world joins directly."""
    from tests.elastic import _jobs as _elastic

    if not int(os.environ.get("HORA_WORLD_GENERATION") or 0):  # not a joiner of a later world
        first = every_op_then_train()
        path = Path(plan.folder, FIRST_WORLD.format(rank=first["where"]["RANK"]))
        path.write_bytes(pickle.dumps(first))
    return _elastic.train(plan)


def first_world(folder: str) -> list[dict[str, Any]]:
    """`every_op_then_train`'s results of `every_op_then_elastic`'s first world, in rank order."""
    return [pickle.loads(Path(folder, FIRST_WORLD.format(rank=r)).read_bytes()) for r in range(NP)]
