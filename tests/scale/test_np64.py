"""Real ranks past 16 on one host (issue 45): np 32 and np 64 local jobs on this machine, many
ranks to a core, each rank checking every op kind against the sums its rank and the world size
give (`_every_op`): allreduce in its forms, allgather, broadcast, alltoall, reducescatter, a
process set, join. At these sizes the negotiation is a tree (HORA_NEGOTIATION_FANOUT 8: two
levels under rank 0) and gloo connects its pairs on first use. Then an elastic run of 31 ranks
grown in place to 32: its world crosses the size from which gloo connects on first use, and the
running ranks must connect its groups as the new rank does (they crashed in gloo before).

On 2 cores np 32 takes about 25 s and the growth about 45 s: both are in the suite, hora's only
32-rank jobs there (the 8-host cluster tests are `slow`). np 64 takes about 60 s and about 11
GiB at its peak (a rank is about 240 MiB; a machine with less memory free skips it): `slow`
(`make test-slow`).
"""

from __future__ import annotations

import psutil
import pytest

import hora
from hora.collectives._rendezvous import LAZY_GLOO_FROM
from tests.elastic import _jobs
from tests.scale import _every_op

GIB = 1 << 30
#: what a job of this many ranks needs free to start: 240 MiB a rank at its peak, and room
MEMORY_NEEDED = {32: 10 * GIB, 64: 16 * GIB}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("np", [32, pytest.param(64, marks=pytest.mark.slow)])
def test_every_op_gives_the_right_sums_on_many_ranks_of_one_host(np: int) -> None:
    free = psutil.virtual_memory().available
    if free < MEMORY_NEEDED[np]:
        pytest.skip(f"np {np} needs {MEMORY_NEEDED[np] / GIB:g} GiB free; {free / GIB:.1f} GiB is")
    results = hora.run(_every_op.every_op, np=np, timeout=500)
    assert [r["rank"] for r in results] == list(range(np))
    failed = _every_op.failures(results)
    assert not failed, "\n".join(f"rank {r}, {case}: {text}" for (r, case), text in failed.items())
    assert all(r["hierarchy_hosts"] is None for r in results)  # one host: shared memory alone


@pytest.mark.timeout(600)
def test_a_world_grown_in_place_to_32_ranks_connects_gloo_alike_on_every_rank(
    tmp_path, capfd
) -> None:
    """31 ranks, max_np 32: the local engine starts the 32nd at once, rank 0 holds its first
    commit until the driver says the new rank waits, and the 31 running ranks re-form with it
    in their processes (before the fix their eager gloo mesh met the new rank's lazy one: 6 of
    them died of SIGSEGV and the run restarted). Every sample once, one process's weights."""
    full = 32
    assert full == LAZY_GLOO_FROM, "the growth below must cross gloo's lazy size"
    (tmp_path / _jobs.BACK_MARK).touch()  # the slot is free: rank 0 waits for the growth only
    # 40 samples a rank at 31, and the 992 left after the first commit (2 steps of 4) deal
    # evenly to 32: the sampler pads no rank's share with a repeated sample
    plan = _jobs.Plan(str(tmp_path), full=full, samples=1240, epochs=1, wait_for_return=True)
    results = hora.run(_jobs.train, (plan,), np=full - 1, min_np=full - 1, max_np=full, timeout=500)
    _steps, worlds = _jobs.check_trained_once(plan, results, atol=1e-9)
    assert worlds == [full - 1, full], worlds
    _jobs.check_survivors(str(tmp_path), results, worlds)  # one attempt, the same processes
    err = capfd.readouterr().err
    assert "hora: restarting" not in err and "attempt 1 of" not in err, err[-3000:]
    assert f"hora: resized in place from {full - 1} to {full} ranks in " in err, err[-3000:]
