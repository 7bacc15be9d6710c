"""Conformance of hora.torch's collective engine on real ranks (2 to 5), launched by hora.run.

One job per world size and data path runs every case of `_cases` inside the ranks (on one host,
on one host without shared memory, and on ranks pretending to sit on several hosts, which takes
the hierarchical path); each test below asserts one case on every rank. Failure modes that end a
job (a peer that shuts down or dies) have jobs of their own.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time
from typing import NamedTuple

import pytest

import hora
from hora.errors import WorkerFailedError
from tests.collectives import _cases

#: The failure jobs' world sizes: 3 ranks, so that the survivors are the coordinator (rank 0)
#: and a rank that is not (at 2 ranks rank 0 alone survives: nothing more is seen there)
SIZES = (3,)


class Job(NamedTuple):
    np: int
    shm: str  # HORA_SHM: "0" keeps gloo's path tested too
    hosts: tuple[int, ...] = ()  # ranks per pretended host (`_cases.pretend_hosts`), or one host
    fanout: int = 0  # HORA_NEGOTIATION_FANOUT (0: the default, a star at these sizes)


# One host uses shared memory for allreduce (at 3 ranks: the even and odd ranks' cases differ in
# count, and at 2 ranks gloo's path is the one without it); ranks that pretend to sit on several
# hosts take the hierarchical path: every local rank across hosts (2 x 2), or one leader per host
# (2 + 1). Each job is a start of its ranks (seconds on 2 cores: the suite's budget).
JOBS = {
    "np3-shm1": Job(3, "1"),
    "np2-shm0": Job(2, "0"),
    "hosts2x2": Job(4, "1", (2, 2)),
    "hosts2+1": Job(3, "1", (2, 1)),
    # A negotiation tree two levels deep (rank 0 -> 1, 2; rank 1 -> 3, 4): every case's rounds
    # relayed by rank 1, its subtree's cached rounds folded into one report.
    "np5-tree": Job(5, "1", fanout=2),
}


def _run(job: Job) -> list[dict[str, str]]:
    env = {"HORA_SHM": job.shm}
    if job.fanout:
        env["HORA_NEGOTIATION_FANOUT"] = str(job.fanout)
    if job.hosts:
        return hora.run(_cases.run_all_on_hosts, (list(job.hosts),), np=job.np, env=env)
    return hora.run(_cases.run_all, np=job.np, env=env)


@pytest.fixture(scope="module")
def outcomes() -> dict[str, list[dict[str, str]]]:
    return {name: _run(job) for name, job in JOBS.items()}


@pytest.mark.parametrize("job", list(JOBS))
@pytest.mark.parametrize("case", list(_cases.CASES))
def test_case(outcomes: dict[str, list[dict[str, str]]], case: str, job: str) -> None:
    per_rank = outcomes[job]
    assert len(per_rank) == JOBS[job].np
    failures = {r: o[case] for r, o in enumerate(per_rank) if o.get(case) != "ok"}
    assert not failures, "\n".join(f"rank {r}: {text}" for r, text in failures.items())


@pytest.mark.parametrize(
    "off",
    [
        ["HOROVOD_HIERARCHICAL_ALLREDUCE"],
        ["HOROVOD_HIERARCHICAL_ALLREDUCE", "HOROVOD_HIERARCHICAL_ALLGATHER"],
    ],
    ids=["allreduce-off", "all-off"],
)
def test_horovods_variables_turn_the_hierarchical_path_off(off: list[str]) -> None:
    """The cases that look at the path taken, on 2 pretended hosts x 2: with
    HOROVOD_HIERARCHICAL_ALLREDUCE=0 allreduces are flat (allgathers and broadcasts are not),
    with HOROVOD_HIERARCHICAL_ALLGATHER=0 too nothing is hierarchical."""
    cases = ["basics", "allreduce_path", "shared_memory_between_hook", "hierarchical_matches_flat"]
    env = dict.fromkeys(off, "0")
    per_rank = hora.run(_cases.run_all_on_hosts, ([2, 2], cases), np=4, env=env)
    assert all(sorted(o) == sorted(cases) for o in per_rank), per_rank
    failures = {
        (r, c): text for r, o in enumerate(per_rank) for c, text in o.items() if text != "ok"
    }
    assert not failures, "\n".join(f"rank {r}, {c}: {text}" for (r, c), text in failures.items())


@pytest.mark.parametrize("np", SIZES)
def test_peer_shutdown_fails_pending_ops(np: int) -> None:
    results = hora.run(_cases.peer_shutdown, np=np)
    assert results[1:] == ["shut down"] * (np - 1)
    assert results[0].startswith("raised after"), results[0]
    assert "shut down" in results[0]
    assert float(results[0].split()[2].rstrip("s:")) < 10


@pytest.mark.parametrize("np", SIZES)
@pytest.mark.parametrize("where", ["negotiation", "shared memory"])
def test_dead_peer_raises_on_the_others(np: int, where: str, tmp_path) -> None:
    path = str(tmp_path / "outcome")
    job = _cases.peer_dies if where == "negotiation" else _cases.peer_dies_in_shared_memory
    with pytest.raises(WorkerFailedError):
        hora.run(job, args=(path,), np=np)
    for r in range(np - 1):
        with open(f"{path}.{r}") as f:
            text = f.read()
        assert text.startswith("HorovodInternalError after"), text
        assert float(text.split()[2].rstrip("s:")) < 10


def test_fusion_threshold_is_honoured() -> None:
    (a, b) = hora.run(_cases.fusion_threshold, np=2, env={"HOROVOD_FUSION_THRESHOLD": "4096"})
    assert a == b
    assert a["calls"] == 16, a  # 4 KB each: two never fit under 4096 bytes
    assert a["small_calls"] < 16, a  # 1 KB each: up to four share a buffer


def test_world_of_one_without_launcher() -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HOROVOD_", "TORCHELASTIC_"))
        and k
        not in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "GROUP_RANK",
        )
    }
    code = (
        "import json; from tests.collectives import _cases; "
        "print(json.dumps(_cases.world_of_one()))"
    )
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    assert out.returncode == 0, out.stderr
    import json

    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {
        "size": 1,
        "rank": 0,
        "allreduce": [0.0, 1.0, 2.0, 3.0],
        "allgather": [0.0, 1.0, 2.0, 3.0],
        "broadcast": [0.0, 1.0, 2.0, 3.0],
        "alltoall": [0.0, 1.0, 2.0, 3.0],
        "reducescatter": [0.0, 1.0, 2.0, 3.0],
        "join": 0,
    }
    assert time.monotonic() - start < 60


def test_reuses_a_user_initialised_default_group() -> None:
    assert hora.run(_cases.user_initialised, np=2) == [([2.0, 2.0], 2.0, True)] * 2


def test_shared_memory_is_gone_once_ranks_have_mapped_it(outcomes) -> None:
    """The segment is unlinked during init: finished (or killed) jobs leave nothing behind."""
    assert outcomes  # the jobs above have run
    assert not glob.glob("/dev/shm/hora-*")
