"""`hora timeline summary`: where the time went, per phase and per rank, as a text table.

Ops fused into one bucket share their transport call, so each tensor's track shows the same
interval: a rank's time in a phase is the union of its intervals (never counted twice), while
`count` and `mean` describe the individual slices.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PhaseStats:
    """One phase (e.g. ALLREDUCE, GLOO_ALLREDUCE, a user region) across ranks."""

    name: str
    count: int = 0
    slice_us: float = 0.0  # sum of slice durations
    busy_us: dict[int, float] = field(default_factory=dict)  # rank -> union of its intervals

    @property
    def total_us(self) -> float:
        return sum(self.busy_us.values())

    @property
    def mean_us(self) -> float:
        return self.slice_us / self.count if self.count else 0.0

    @property
    def slowest_rank(self) -> int:
        return max(self.busy_us, key=lambda r: (self.busy_us[r], -r))


@dataclass
class Summary:
    phases: dict[str, PhaseStats]
    per_rank: dict[tuple[int, str], tuple[int, float, float]]  # -> (count, busy µs, mean µs)
    ranks: list[int]
    unfinished: int  # begins without an end (a run killed mid-operation)


def load_trace(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The events of a trace file (JSON array or `{"traceEvents": [...]}` object)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = _complete_events(text)
    if isinstance(data, dict):
        data = data.get("traceEvents", [])
    if not isinstance(data, list):
        raise ValueError(f"{path} is not a Chrome trace (expected a JSON array of events)")
    return [e for e in data if isinstance(e, dict)]


def _complete_events(text: str) -> Any:
    """A trace whose writer was killed mid-write (see _file.py): every event before the torn
    one. Events are one per line, so the torn tail is the last line or two."""
    lines = text.rstrip().split("\n")
    for cut in range(len(lines), max(len(lines) - 3, 1), -1):
        head = "\n".join(lines[:cut]).rstrip().rstrip(",")
        try:
            return json.loads(head + "\n]")
        except json.JSONDecodeError:
            continue
    return json.loads(text)  # not a torn trace: raise the parser's own error


def summarize(events: list[dict[str, Any]]) -> Summary:
    """Pair B/E events per track (and take X events) into per-phase, per-rank statistics."""
    stacks: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    intervals: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    phases: dict[str, PhaseStats] = {}
    ranks: set[int] = set()
    # File order, not timestamp order: within a track it is the recording order, and it keeps a
    # zero-length slice's begin before its end.
    for ev in (e for e in events if e.get("ph") in ("B", "E", "X")):
        track = (ev.get("pid"), ev.get("tid"))
        if ev["ph"] == "B":
            stacks[track].append(ev)
            continue
        if ev["ph"] == "X":
            start, end, name = float(ev["ts"]), float(ev["ts"]) + float(ev.get("dur", 0)), ev
        else:
            if not stacks[track]:
                continue
            begin = stacks[track].pop()
            start, end, name = float(begin["ts"]), float(ev["ts"]), begin
        rank = _rank(ev.get("pid"))
        phase = str(name.get("name", "?"))
        stats = phases.setdefault(phase, PhaseStats(phase))
        stats.count += 1
        stats.slice_us += end - start
        intervals[(rank, phase)].append((start, end))
        ranks.add(rank)
    per_rank: dict[tuple[int, str], tuple[int, float, float]] = {}
    for (rank, phase), spans in intervals.items():
        busy = _union(spans)
        phases[phase].busy_us[rank] = busy
        per_rank[(rank, phase)] = (len(spans), busy, sum(e - s for s, e in spans) / len(spans))
    unfinished = sum(len(s) for s in stacks.values())
    return Summary(phases, per_rank, sorted(ranks), unfinished)


def format_summary(summary: Summary) -> str:
    """Two tables: per phase across ranks (slowest first), then per rank and phase."""
    order = sorted(summary.phases.values(), key=lambda s: -s.total_us)
    lines = [
        f"{len(summary.ranks)} rank(s); time is the union of a rank's intervals in each phase "
        "(fused tensors are not counted twice)",
        "",
        f"{'phase':<32} {'count':>7} {'total ms':>10} {'mean ms':>9}  slowest rank (ms)",
    ]
    for s in order:
        slow = s.slowest_rank
        lines.append(
            f"{s.name:<32} {s.count:>7} {s.total_us / 1e3:>10.2f} {s.mean_us / 1e3:>9.3f}  "
            f"{slow} ({s.busy_us[slow] / 1e3:.2f})"
        )
    lines += ["", f"{'rank':<5} {'phase':<32} {'count':>7} {'total ms':>10} {'mean ms':>9}"]
    for rank in summary.ranks:
        for s in order:
            if (rank, s.name) in summary.per_rank:
                count, busy, mean = summary.per_rank[(rank, s.name)]
                lines.append(
                    f"{rank:<5} {s.name:<32} {count:>7} {busy / 1e3:>10.2f} {mean / 1e3:>9.3f}"
                )
    if summary.unfinished:
        lines += ["", f"{summary.unfinished} slice(s) never ended (the run stopped mid-operation)"]
    return "\n".join(lines)


def summary_text(path: str | os.PathLike[str]) -> str:
    """The `hora timeline summary` output for the trace at `path`."""
    summary = summarize(load_trace(path))
    if not summary.phases:
        return f"{path}: no complete slices in this trace"
    return format_summary(summary)


def _rank(pid: Any) -> int:
    try:
        return int(pid)
    except (TypeError, ValueError):
        return -1


def _union(spans: list[tuple[float, float]]) -> float:
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(spans):
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total
