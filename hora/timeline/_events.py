"""Raw recorder events to Chrome trace events, one rank at a time.

The hot path records bare tuples; this module, run by the flusher or by the driver, turns them
into JSON text. It owns everything that needs state: which track (tid) a tensor is drawn on,
which phases are open on it, and the repairs that keep every track well nested even though two
threads record into one buffer (the caller's `NEGOTIATE_*` begin can land after the loop's end).
"""

from __future__ import annotations

import heapq
import json
from typing import Any

#: (wall-clock ns, kind, track, phase, args); kind is "B", "E", CYCLE or STOP.
RawEvent = tuple[int, str, str, str, Any]

CYCLE = "i"
STOP = "stop"  # the recording stops: close every open phase
REGION_PREFIX = "\0"  # a track key for user regions: REGION_PREFIX + thread name
NEGOTIATE = "NEGOTIATE_"
NONAME = ".noname."
CYCLE_TID = 0  # the cycle marks' track; tensors and regions start at 1


def _ts(ns: int) -> str:
    """Microseconds with nanosecond decimals, without float rounding."""
    return f"{ns // 1000}.{ns % 1000:03d}"


class RankTrack:
    """Converts one rank's raw events, in recording order, to Chrome trace JSON objects (text)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.dropped = 0  # ends that matched nothing (recording started mid-operation)
        self._started = False
        self._tids: dict[str, int] = {}  # named tensor or region -> tid
        self._next_tid = CYCLE_TID + 1
        self._lane_of: dict[str, int] = {}  # unnamed op in flight -> its lane's tid
        self._free_lanes: list[int] = []
        self._lane_count = 0
        self._stacks: dict[int, list[str]] = {}
        self._last: dict[int, int] = {}  # tid -> last timestamp written (ns)
        self._held: dict[str, list[RawEvent]] = {}  # ended before its NEGOTIATE begin was seen
        self._names: dict[str, str] = {}  # JSON-encoded strings, cached

    def convert(self, events: list[RawEvent]) -> list[str]:
        out: list[str] = []
        if not self._started:
            self._started = True
            out.append(self._meta("process_name", 0, f"rank {self.rank}"))
            out.append(self._meta("process_sort_index", 0, self.rank))
        # The fast path, inlined (the driver converts every rank's events): a begin or end on a
        # known named track, nothing held back. Everything else goes through `_one`.
        append = out.append
        tids, stacks, last, held = self._tids, self._stacks, self._last, self._held
        names = self._names
        template = '{"name":%s,"ph":"%s","ts":%d.%03d,"pid":' + str(self.rank) + ',"tid":%d%s}'
        for ev in events:
            ts, kind, key, phase, args = ev
            tid = tids.get(key)
            stack = stacks.get(tid) if tid is not None else None
            if tid is None or stack is None or held or (kind != "B" and kind != "E"):
                self._one(ev, out)
                continue
            if kind == "B":
                if not stack:
                    self._one(ev, out)  # a top-level slice: it names its tensor
                    continue
                stack.append(phase)
                extra = ""
            else:
                if not stack or stack[-1] != phase:
                    self._one(ev, out)
                    continue
                stack.pop()
                extra = f',"args":{json.dumps(args, separators=(",", ":"))}' if args else ""
            previous = last[tid]
            if ts < previous:
                ts = previous
            last[tid] = ts
            name = names.get(phase) or self._js(phase)
            append(template % (name, kind, ts // 1000, ts % 1000, tid, extra))
        return out

    # -- one event ---------------------------------------------------------------------------
    def _one(self, ev: RawEvent, out: list[str]) -> None:
        ts, kind, key, phase, args = ev
        if kind == "B" or kind == "E":
            held = self._held.get(key)
            if held is not None:
                if kind == "B" and phase.startswith(NEGOTIATE):
                    # The begin arrives late: start it no later than its end, then replay.
                    del self._held[key]
                    self._one((min(ts, held[0][0]), kind, key, phase, args), out)
                    for h in held:
                        self._one(h, out)
                else:
                    held.append(ev)
                return
            if kind == "B":
                self._begin(ts, key, phase, out)
            else:
                self._end(ev, out)
        elif kind == CYCLE:
            if CYCLE_TID not in self._last:
                self._last[CYCLE_TID] = 0
                out.append(self._meta("thread_name", CYCLE_TID, "cycles"))
            out.append(
                f'{{"name":"CYCLE_START","ph":"i","s":"p","ts":{_ts(ts)},'
                f'"pid":{self.rank},"tid":{CYCLE_TID}}}'
            )
        elif kind == STOP:
            self._close_all(ts, out)

    def _begin(self, ts: int, key: str, phase: str, out: list[str]) -> None:
        tid = self._tid(key, out)
        stack = self._stacks.setdefault(tid, [])
        ts = self._clamp(tid, ts)
        args = ""
        if not stack and not key.startswith(REGION_PREFIX):
            args = f',"args":{{"tensor":{self._js(key)}}}'  # top-level slices name their tensor
        stack.append(phase)
        out.append(
            f'{{"name":{self._js(phase)},"ph":"B","ts":{_ts(ts)},'
            f'"pid":{self.rank},"tid":{tid}{args}}}'
        )

    def _end(self, ev: RawEvent, out: list[str]) -> None:
        ts, _kind, key, phase, args = ev
        tid = self._lane_of.get(key) if NONAME in key else self._tids.get(key)
        stack = self._stacks.get(tid) if tid is not None else None
        if not stack or stack[-1] != phase:
            if phase.startswith(NEGOTIATE) and not key.startswith(REGION_PREFIX):
                self._held[key] = [ev]  # its begin is still in the other thread's hands
            else:
                self.dropped += 1
            return
        assert tid is not None
        stack.pop()
        ts = self._clamp(tid, ts)
        extra = f',"args":{json.dumps(args, separators=(",", ":"))}' if args else ""
        out.append(
            f'{{"name":{self._js(phase)},"ph":"E","ts":{_ts(ts)},'
            f'"pid":{self.rank},"tid":{tid}{extra}}}'
        )
        if not stack and key in self._lane_of:
            heapq.heappush(self._free_lanes, self._lane_of.pop(key))

    def _close_all(self, ts: int, out: list[str]) -> None:
        """End what is open (the recording stopped mid-operation), so the file stays balanced."""
        for tid, stack in self._stacks.items():
            while stack:
                phase = stack.pop()
                out.append(
                    f'{{"name":{self._js(phase)},"ph":"E","ts":{_ts(self._clamp(tid, ts))},'
                    f'"pid":{self.rank},"tid":{tid},"args":{{"unfinished":true}}}}'
                )
        self._held.clear()
        self._free_lanes.extend(self._lane_of.values())
        heapq.heapify(self._free_lanes)
        self._lane_of.clear()

    # -- tracks ------------------------------------------------------------------------------
    def _tid(self, key: str, out: list[str]) -> int:
        if NONAME in key:
            # Unnamed ops get a fresh name each call: draw them on a few reusable lanes.
            tid = self._lane_of.get(key)
            if tid is None:
                if self._free_lanes:
                    tid = heapq.heappop(self._free_lanes)
                else:
                    self._lane_count += 1
                    tid = self._new_tid(f"unnamed ops #{self._lane_count}", out)
                self._lane_of[key] = tid
            return tid
        tid = self._tids.get(key)
        if tid is None:
            if key.startswith(REGION_PREFIX):
                tid = self._new_tid(f"regions ({key[1:]})", out, sort=-1)
            else:
                tid = self._new_tid(key, out)
            self._tids[key] = tid
        return tid

    def _new_tid(self, label: str, out: list[str], sort: int | None = None) -> int:
        tid = self._next_tid
        self._next_tid += 1
        out.append(self._meta("thread_name", tid, label))
        out.append(self._meta("thread_sort_index", tid, tid if sort is None else sort))
        return tid

    def _clamp(self, tid: int, ts: int) -> int:
        """Timestamps never go back on a track (events come from two threads)."""
        last = self._last.get(tid, 0)
        if ts < last:
            ts = last
        self._last[tid] = ts
        return ts

    def _meta(self, what: str, tid: int, value: Any) -> str:
        key = "sort_index" if what.endswith("sort_index") else "name"
        return json.dumps(
            {"name": what, "ph": "M", "pid": self.rank, "tid": tid, "args": {key: value}},
            separators=(",", ":"),
        )

    def _js(self, text: str) -> str:
        encoded = self._names.get(text)
        if encoded is None:
            encoded = self._names[text] = json.dumps(text)
        return encoded
