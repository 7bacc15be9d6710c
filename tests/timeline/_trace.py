"""Reading a trace back the way a viewer does: tracks, slices, nesting."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Slice:
    rank: int
    tid: int
    name: str
    start: float
    end: float
    args: dict[str, Any]
    children: list[Slice] = field(default_factory=list)


@dataclass
class Trace:
    events: list[dict[str, Any]]
    ranks: dict[int, str]  # pid -> process_name
    threads: dict[tuple[int, int], str]  # (pid, tid) -> thread_name
    roots: dict[tuple[int, int], list[Slice]]  # top-level slices per track
    unfinished: int

    def track(self, rank: int, thread_name: str) -> list[Slice]:
        tids = [t for (p, t), n in self.threads.items() if p == rank and n == thread_name]
        assert len(tids) == 1, f"rank {rank}: {len(tids)} tracks named {thread_name!r}"
        return self.roots[(rank, tids[0])]

    def instants(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("ph") == "i" and e.get("name") == name]


def read(path: Path) -> Trace:
    """Parse `path` and check what every viewer relies on: each track's B/E events nest."""
    events = json.loads(path.read_text())
    assert isinstance(events, list)
    ranks: dict[int, str] = {}
    threads: dict[tuple[int, int], str] = {}
    stacks: dict[tuple[int, int], list[Slice]] = {}
    roots: dict[tuple[int, int], list[Slice]] = {}
    last: dict[tuple[int, int], float] = {}
    for ev in events:
        ph = ev["ph"]
        if ph == "M":
            if ev["name"] == "process_name":
                ranks[ev["pid"]] = ev["args"]["name"]
            elif ev["name"] == "thread_name":
                threads[(ev["pid"], ev["tid"])] = ev["args"]["name"]
            continue
        key = (ev["pid"], ev["tid"])
        ts = float(ev["ts"])
        assert ts >= last.get(key, 0.0), f"time goes back on track {key}: {ev}"
        last[key] = ts
        if ph == "B":
            s = Slice(ev["pid"], ev["tid"], ev["name"], ts, -1.0, dict(ev.get("args", {})))
            stack = stacks.setdefault(key, [])
            (stack[-1].children if stack else roots.setdefault(key, [])).append(s)
            stack.append(s)
        elif ph == "E":
            stack = stacks.get(key)
            assert stack, f"an end with no begin on track {key}: {ev}"
            s = stack.pop()
            assert s.name == ev["name"], f"{ev['name']} ends while {s.name} is open on {key}"
            s.end = ts
            s.args.update(ev.get("args", {}))
    unfinished = sum(len(s) for s in stacks.values())
    return Trace(events, ranks, threads, roots, unfinished)


def names(slices: list[Slice]) -> list[str]:
    return [s.name for s in slices]
