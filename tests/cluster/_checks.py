"""What the multi-host tests assert about a job's ranks, and a thread that strikes a fault at the
moment a job marks."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tests.cluster import _jobs

REPORT_SECONDS = 60.0  # a lost peer must be reported within this (issue 23)
JOB_TIMEOUT = 240.0  # a safety net under pytest's own timeout


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
