"""Resizing a local elastic run in place against today's restart, on this machine (no cluster).

The elastic tests' job (`tests/elastic/_jobs.py`: a small MLP, 0.05 s per step, a commit every
2 steps), two measures:

- lost: np=3, min_np=2; its last rank SIGKILLs itself after its second commit. Seconds from the
  kill to the first step of the world that trains on: the survivors re-formed in place, or
  (`HORA_ELASTIC_IN_PLACE=0`) every rank restarted after the settle time (locally at max_np=3).
- grown: np=2, min_np=2, max_np=3 (the local engine has room for 3, so the run grows once the
  settle time passed). Seconds from the driver's growth decision (its growth watch firing) to the
  first step at 3 ranks: a new rank started and joined at the running ranks' next commit, or
  every rank stopped at that commit and 3 restarted from it; in place also to the new rank's
  start of `hvd.elastic.run`, its state synced (its own start, with its setup between
  `hvd.init()` and the loop, which the running ranks wait for: issue 32's goal is that plus one
  commit interval). The running ranks hold their first commit until the driver's word
  arrives, so the growth happens there in both.

    .venv/bin/python bench/elastic_in_place.py

Wall-clock, on the shared 2-core machine: compare the rows of one run.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import hora
from hora.job.elastic import FreeSlots
from tests.elastic import _jobs

_decided: list[float] = []  # when a growth watch fired (time.time())
_due = FreeSlots.due


def _noting_due(self: FreeSlots, now: float) -> bool:
    fired = _due(self, now)
    if fired:
        _decided.append(time.time())
    return fired


FreeSlots.due = _noting_due  # type: ignore[method-assign]


def _steps(folder: str) -> list[dict]:
    return [
        entry
        for path in Path(folder).glob("log-*.jsonl")
        for entry in map(json.loads, path.read_text().splitlines())
        if "t" in entry
    ]


def kill_to_next_world(in_place: bool) -> float:
    folder = tempfile.mkdtemp(prefix="hora-bench-in-place-")
    os.environ["HORA_ELASTIC_IN_PLACE"] = "1" if in_place else "0"
    plan = _jobs.Plan(folder, full=3, fault="self", fault_commit=2)
    hora.run(_jobs.train, (plan,), np=3, min_np=2, timeout=240)
    killed = float(Path(folder, _jobs.KILLED_MARK).read_text())
    # the next world's logs: attempt 0's second world in place, attempt 1's first on a restart
    pattern = "log-0-1-*.jsonl" if in_place else "log-1-0-*.jsonl"
    times = [
        entry["t"]
        for path in Path(folder).glob(pattern)
        for entry in map(json.loads, path.read_text().splitlines())
        if "t" in entry
    ]
    return min(times) - killed


def decision_to_full_world(in_place: bool) -> tuple[float, float | None]:
    """Seconds from the decision to the first step at 3 ranks, and (in place) to the new
    rank's start of `hvd.elastic.run` with the state synced: its own start."""
    folder = tempfile.mkdtemp(prefix="hora-bench-grow-")
    os.environ["HORA_ELASTIC_IN_PLACE"] = "1" if in_place else "0"
    Path(folder, _jobs.BACK_MARK).touch()  # the local engine's slots are always there
    plan = _jobs.Plan(folder, full=3, wait_for_return=True)
    _decided.clear()
    hora.run(_jobs.train, (plan,), np=2, min_np=2, max_np=3, timeout=240)
    decided = _decided[0]
    first = min(e["t"] for e in _steps(folder) if e["world"] == 3 and e["t"] > decided)
    # the new rank's first entry: world 1 of attempt 0, its rank 2 (in place only)
    joined = [json.loads(line) for line in _lines(Path(folder, "log-0-1-2.jsonl"))]
    return first - decided, (joined[0]["at"] - decided if joined else None)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def main() -> None:
    os.environ["HORA_ELASTIC_SETTLE_SECONDS"] = os.environ.get("HORA_ELASTIC_SETTLE_SECONDS", "5")
    for in_place, name in ((True, "in place"), (False, "restart (settle 5 s)")):
        print(
            f"{name:>22}: kill -> first step of the next world {kill_to_next_world(in_place):.2f} s"
        )
    for in_place, name in ((True, "grown in place"), (False, "grown by a restart")):
        seconds, own_start = decision_to_full_world(in_place)
        start = f" (the new rank's own start: {own_start:.2f} s)" if own_start is not None else ""
        print(f"{name:>22}: growth decision -> first step at 3 ranks {seconds:.2f} s{start}")


if __name__ == "__main__":
    main()
