"""A lost local rank: in place against today's restart, on this machine (no cluster).

The elastic tests' job (`tests/elastic/_jobs.py`: a small MLP, 0.05 s per step, a commit every
2 steps) at np=3, min_np=2; its last rank SIGKILLs itself after its second commit. Seconds from
the kill to the first step of the world that trains on: the survivors re-formed in place, or
(`HORA_ELASTIC_IN_PLACE=0`) every rank restarted after the settle time (locally at max_np=3).

    .venv/bin/python bench/elastic_in_place.py

Wall-clock, on the shared 2-core machine: compare the rows of one run.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import hora
from tests.elastic import _jobs


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


def main() -> None:
    for in_place, name in ((True, "in place"), (False, "restart (settle 5 s)")):
        print(
            f"{name:>22}: kill -> first step of the next world {kill_to_next_world(in_place):.2f} s"
        )


if __name__ == "__main__":
    main()
