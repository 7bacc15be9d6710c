"""What the multi-host tests assert about a job's ranks, a thread that strikes a fault at the
moment a job marks, and the cut-off scenario every engine is put through."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import hora
from hora.job.silence import DEFAULT_SILENCE_SECONDS, SILENCE_VAR
from tests.cluster import _jobs
from tests.cluster._cluster import Cluster
from tests.cluster._hosts import Host

REPORT_SECONDS = 60.0  # a lost peer must be reported within this (issue 23)
JOB_TIMEOUT = 240.0  # a safety net under pytest's own timeout
# For jobs that wait on a cut-off host: hora's stall shutdown (public, default 600 s) ends them
# after this, so that such a test takes about a minute however late the engine notices; never
# under REPORT_SECONDS, so it cannot pass for the detection the tests ask for.
BOUNDED_WAIT = {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(REPORT_SECONDS + 5)}
# The cut-off tests' HORA_HEARTBEAT_TIMEOUT_SECONDS on the driver, for its default's 30 s: what a
# report takes beyond the silence is measured, and the default's report time judged from it
# (tests/job/test_heartbeat.py checks the default itself). Still 5 heartbeats (2 s apart) long.
CUT_OFF_SILENCE_SECONDS = 10.0


def placement_table(places: list[dict[str, Any]]) -> str:
    """`rank->host(local rank)` for the ranks of one job, in rank order."""
    return ", ".join(f"{p['RANK']}->{p['host']}(local {p['LOCAL_RANK']})" for p in places)


def assert_spread(places: list[dict[str, Any]], hosts: int, per_host: int) -> None:
    """Every one of `hosts` hosts runs `per_host` ranks, whose local ranks count 0, 1, ..."""
    table = placement_table(places)
    counts = Counter(p["host"] for p in places)
    assert sorted(counts) == [f"host{i}" for i in range(1, hosts + 1)], table
    assert set(counts.values()) == {per_host}, table
    for host in counts:
        local = sorted(p["LOCAL_RANK"] for p in places if p["host"] == host)
        assert local == list(range(per_host)), table
    assert {p["LOCAL_WORLD_SIZE"] for p in places} == {per_host}, table
    assert {p["GROUP_WORLD_SIZE"] for p in places} == {hosts}, table


def assert_spread_per_task(places: list[dict[str, Any]], hosts: int, per_host: int) -> None:
    """As `assert_spread`, for TorchDistributor's ranks on Spark, numbered as pyspark's one
    torchrun per task numbers them: every LOCAL_RANK 0 of 1, GROUP_RANK the rank's task."""
    table = placement_table(places)
    counts = Counter(p["host"] for p in places)
    assert sorted(counts) == [f"host{i}" for i in range(1, hosts + 1)], table
    assert set(counts.values()) == {per_host}, table
    assert {(p["LOCAL_RANK"], p["LOCAL_WORLD_SIZE"]) for p in places} == {(0, 1)}, table
    assert [p["GROUP_RANK"] for p in places] == [p["RANK"] for p in places], table
    assert {p["GROUP_WORLD_SIZE"] for p in places} == {hosts * per_host}, table


def assert_trained_like_one_process(results: list[dict[str, Any]]) -> None:
    """Every rank ends with the same model, bit for bit, and it is the one-process model."""
    want = _jobs.reference(len(results))
    first = results[0]["weights"]
    for r in results:
        assert all(torch.equal(r["weights"][k], first[k]) for k in first), r["where"]
    for key, value in want.items():
        assert torch.allclose(first[key], value, rtol=1e-5, atol=1e-6), (key, first[key], value)


class Watcher(threading.Thread):
    """Once `ready()` returns a value, `act(value)` runs once, and when is kept."""

    def __init__(self, ready: Callable[[], Any], act: Callable[[Any], object]):
        super().__init__(daemon=True)
        self.ready, self.act = ready, act
        self.acted_at: float | None = None
        self.value: Any = None
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.05):
            value = self.ready()
            if value:
                self.act(value)
                self.value, self.acted_at = value, time.monotonic()
                return

    def __enter__(self) -> Watcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self.join(timeout=30)


def marked_host(folder: Path) -> Callable[[], str | None]:
    """The host a rank of `_jobs.train` wrote to `folder` when it met its "kill_host" fault."""

    def ready() -> str | None:
        mark = folder / _jobs.HOST_MARK
        return (mark.read_text() or None) if mark.exists() else None

    return ready


def looping_rank_host(folder: Path, np: int) -> Callable[[], str | None]:
    """Rank 1's host, once all `np` ranks of `_jobs.allreduce_until_cut_off` are looping."""

    def ready() -> str | None:
        if len(list(folder.glob("looping-*"))) < np:
            return None
        return (folder / "looping-1").read_text() or None

    return ready


@dataclass(frozen=True)
class CutOff:
    """What a job said after one of its hosts was cut off, and how long after the cut."""

    host: Host
    seconds: float
    story: str

    def __str__(self) -> str:
        first = self.story.splitlines()[0]
        return f"{self.host.name} cut, reported {self.seconds:.1f} s later: {first}"

    def assert_reported_in_time_naming_the_host(self) -> None:
        """Named by hora's heartbeat check; with the default silence time, within REPORT_SECONDS
        (the report's delay beyond the shortened silence, plus the default's)."""
        with_default = self.seconds - CUT_OFF_SILENCE_SECONDS + DEFAULT_SILENCE_SECONDS
        assert with_default < REPORT_SECONDS, f"{self}; {with_default:.1f} s with the default"
        assert f"{SILENCE_VAR}={CUT_OFF_SILENCE_SECONDS:g}" in self.story, str(self)
        host = self.host
        assert re.search(rf"\b({host.name}|{re.escape(host.address)})\b", self.story), str(self)


def cut_off_mid_collective(cluster: Cluster, folder: Path, backend: str, np: int) -> CutOff:
    """Every rank allreduces in a loop; once all do, rank 1's host loses its link (veth down),
    its processes alive, until the job fails (the driver's silence time shortened)."""
    with (
        pytest.MonkeyPatch.context() as env,
        Watcher(looping_rank_host(folder, np), cluster.cut_off) as cutter,
        pytest.raises(hora.HoraError) as info,
    ):
        env.setenv(SILENCE_VAR, f"{CUT_OFF_SILENCE_SECONDS:g}")
        hora.run(
            _jobs.allreduce_until_cut_off,
            (str(folder),),
            np=np,
            backend=backend,
            env=BOUNDED_WAIT,
            timeout=JOB_TIMEOUT,
        )
    seconds = time.monotonic() - (cutter.acted_at or 0)
    return CutOff(cluster.host(cutter.value), seconds, str(info.value))
