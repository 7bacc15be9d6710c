"""The stall inspector: rank 0 notices collectives that some ranks never submit, says so, ends them.

Collectives are matched by name, so ranks that submit different names (or a rank that skips one)
wait for each other forever: negotiation itself has no timeout. As Horovod's stall inspector, the
coordinator warns every HOROVOD_STALL_CHECK_TIME_SECONDS (default 60) while an operation has
waited that long, naming the operations, the ranks that are ready and the ranks that are missing;
after HOROVOD_STALL_SHUTDOWN_TIME_SECONDS it stops every rank with that diagnosis (each pending and
later collective raises HorovodInternalError). Horovod never stops by default (0); a job that can
never finish must end, so hora's default is 600 s: NCCL's default process-group timeout, which
PyTorch users already live with, and ten warnings' worth of a rank evaluating or checkpointing on
its own. An explicit 0 keeps Horovod's meaning (warn forever); HOROVOD_STALL_CHECK_DISABLE=1
turns the inspector off altogether, as in Horovod.

Under hora's launcher the warnings go to the driver (one "hora: stall: ..." line each, and the
last one is repeated in the job's RunTimeoutError); elsewhere (torchrun) to rank 0's stderr.

Cost: nothing per operation. The coordinator calls `inspect` once per negotiation round; while
something waits, the inspector notes at most every `resolution_s` which waiting operations it has
seen (an instance is told apart by the identity of the coordinator's request table for it), so an
age is under-estimated by at most that resolution.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hora.collectives._control.negotiation import Coordinator

log = logging.getLogger("hora.torch")

CHECK_DISABLE = "HOROVOD_STALL_CHECK_DISABLE"
CHECK_TIME = "HOROVOD_STALL_CHECK_TIME_SECONDS"
SHUTDOWN_TIME = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"
DEFAULT_CHECK_S = 60.0
DEFAULT_SHUTDOWN_S = 600.0
MAX_NAMES = 5  # per group of operations waiting for the same ranks
MAX_GROUPS = 5
MAX_RANKS = 16


@dataclass(frozen=True)
class StallSettings:
    check_s: float = DEFAULT_CHECK_S
    shutdown_s: float = DEFAULT_SHUTDOWN_S  # 0: warn forever, never stop
    enabled: bool = True

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> StallSettings:
        """Read Horovod's variables; a bad value is a ValueError that names the variable."""
        env = os.environ if environ is None else environ
        check = _seconds(env, CHECK_TIME, DEFAULT_CHECK_S)
        if check <= 0:
            raise ValueError(f"{CHECK_TIME} must be a positive number of seconds, got {check:g}")
        return cls(check, _seconds(env, SHUTDOWN_TIME, DEFAULT_SHUTDOWN_S), not _disabled(env))

    @property
    def resolution_s(self) -> float:
        """How stale the inspector's view of what waits may be (a tenth of its shortest time)."""
        shortest = min(self.check_s, self.shutdown_s) if self.shutdown_s > 0 else self.check_s
        return min(1.0, shortest / 10)


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {text!r}") from None
    if not value >= 0:  # also refuses nan
        raise ValueError(f"{name} must be a number of seconds >= 0, got {text!r}")
    return value


def _disabled(env: Mapping[str, str]) -> bool:
    text = env.get(CHECK_DISABLE, "").strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return False
    if text in ("true", "yes", "on"):
        return True
    try:
        return int(text) > 0  # Horovod: strtol(value) > 0
    except ValueError:
        raise ValueError(f"{CHECK_DISABLE} must be 1 or 0, got {text!r}") from None


@dataclass(frozen=True)
class Waiting:
    """One operation (or the join) some ranks wait on; `since` is when it started waiting."""

    name: str  # "" for the join
    process_set_id: int
    ready: tuple[int, ...]
    joined: tuple[int, ...]
    missing: tuple[int, ...]
    since: float


def _ranks(ranks: tuple[int, ...]) -> str:
    if len(ranks) <= MAX_RANKS:
        return f"ranks {list(ranks)}"
    shown = ", ".join(map(str, ranks[:MAX_RANKS]))
    return f"{len(ranks)} ranks [{shown}, ...]"


def describe(waiting: list[Waiting], now: float) -> str:
    """One line: the waiting operations grouped by who is ready and who is missing, oldest first.

    For example "tensor 'x' waiting for 63 s: ready on ranks [0], missing on ranks [1]".
    """
    groups: dict[tuple[Any, ...], list[Waiting]] = {}
    for w in sorted(waiting, key=lambda w: (w.since, w.name)):
        key = (w.name == "", w.process_set_id, w.ready, w.joined, w.missing)
        groups.setdefault(key, []).append(w)
    parts = []
    for (is_join, ps_id, ready, joined, missing), members in list(groups.items())[:MAX_GROUPS]:
        age = f"{now - members[0].since:.0f} s"
        if is_join:
            parts.append(
                f"join waiting for {age} with no collective completing: joined {_ranks(joined)}, "
                f"missing {_ranks(missing)}"
            )
            continue
        names = ", ".join(f"'{w.name}'" for w in members[:MAX_NAMES])
        if len(members) > MAX_NAMES:
            names += f" and {len(members) - MAX_NAMES} more"
        what = "tensor" if len(members) == 1 else "tensors"
        where = f" in process set {ps_id}" if ps_id != 0 else ""
        also = f", joined {_ranks(joined)}" if joined else ""
        parts.append(
            f"{what} {names}{where} waiting for {age}: ready on {_ranks(ready)}{also}, "
            f"missing on {_ranks(missing)}"
        )
    if len(groups) > MAX_GROUPS:
        parts.append(f"and {len(groups) - MAX_GROUPS} more groups of waiting operations")
    return "; ".join(parts)


class StallNotice(str):
    """A stall report's text, with what the driver needs to ask the right ranks where they are:
    the ranks the stalled collectives wait for, and whether every rank is being stopped now."""

    missing: tuple[int, ...] = ()
    stopping: bool = False

    @classmethod
    def of(cls, text: str, stalled: list[Waiting], stopping: bool = False) -> StallNotice:
        notice = cls(text)
        notice.missing = tuple(sorted({r for w in stalled for r in w.missing}))
        notice.stopping = stopping
        return notice


def log_stall(text: str | None) -> None:
    """A stall to rank 0's stderr, where no driver hears it (the collectives' hook,
    `_driver.report_stall`, tells a hora run's driver instead)."""
    if text is not None:
        log.warning("hora: stall: %s", text)


class StallInspector:
    """Watches a `Coordinator` from rank 0's loop thread: `inspect` after every round, and
    sleep no longer than `wake_in`."""

    def __init__(
        self,
        settings: StallSettings,
        coordinator: Coordinator,
        report: Callable[[str | None], None] = log_stall,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._coord = coordinator
        self._report = report
        self._clock = clock
        self._seen: dict[tuple[int, str], tuple[Mapping[int, object], float]] = {}
        self._join_since: float | None = None
        self._oldest: float | None = None  # the earliest `since` of the last sample
        self._progressed = False  # some collective completed since the last sample
        self._next_sample = 0.0
        self._unsampled = False  # a round since the last sample may have changed what waits
        self._last_warning: float | None = None
        self._warning_stands = False  # the driver holds a warning for RunTimeoutError
        self._stopped = False

    def inspect(self, progressed: bool) -> str | None:
        """After a coordinator round (`progressed`: it completed something): the reason to shut
        every rank down, once the stall has lasted the shutdown time; else None."""
        if not self.settings.enabled or self._stopped:
            return None
        coord = self._coord
        if progressed:
            self._progressed = True
        if not coord.has_pending() and not coord.joined:
            if self._seen or self._join_since is not None or self._unsampled:
                self._reset()
            return None
        now = self._clock()
        if now >= self._next_sample:
            self._sample(now)
        else:
            self._unsampled = True
        due = self._next_due()
        if due is None or now < due:
            return None
        return self._act(now)

    def wake_in(self) -> float | None:
        """Seconds until `inspect` must run again although nothing else happened; None: never."""
        if not self.settings.enabled or self._stopped:
            return None
        due = self._next_due()
        if self._unsampled:
            due = self._next_sample if due is None else min(due, self._next_sample)
        return None if due is None else max(0.0, due - self._clock())

    # ----- internals ---------------------------------------------------------------------------
    def _reset(self) -> None:
        self._seen = {}
        self._join_since = None
        self._oldest = None
        self._next_sample = 0.0  # a new stall is noted at its very first round
        self._unsampled = False
        self._last_warning = None
        if self._warning_stands:
            self._warning_stands = False
            self._report(None)

    def _sample(self, now: float) -> None:
        coord = self._coord
        seen: dict[tuple[int, str], tuple[Mapping[int, object], float]] = {}
        for key, requests in coord.pending.items():
            old = self._seen.get(key)
            seen[key] = old if old is not None and old[0] is requests else (requests, now)
        self._seen = seen
        if not coord.joined:
            self._join_since = None
        elif self._join_since is None or self._progressed:
            self._join_since = now
        self._progressed = False
        self._unsampled = False
        self._next_sample = now + self.settings.resolution_s
        times = [since for _, since in seen.values()]
        if self._join_since is not None:
            times.append(self._join_since)
        self._oldest = min(times, default=None)

    def _next_due(self) -> float | None:
        oldest = self._oldest
        if oldest is None:
            return None
        check, shutdown = self.settings.check_s, self.settings.shutdown_s
        due = oldest + check
        if self._last_warning is not None:
            due = max(due, self._last_warning + check)
        return min(due, oldest + shutdown) if shutdown > 0 else due

    def _waiting(self) -> list[Waiting]:
        coord = self._coord
        joined = tuple(sorted(coord.joined))
        out = []
        for (ps_id, name), (requests, since) in self._seen.items():
            members = coord.members.get(ps_id, ())
            ready = tuple(sorted(requests))
            missing = tuple(r for r in members if r not in requests and r not in coord.joined)
            in_set = tuple(r for r in joined if r in members)
            out.append(Waiting(name, ps_id, ready, in_set, missing, since))
        if self._join_since is not None:
            missing = tuple(r for r in range(coord.size) if r not in coord.joined)
            out.append(Waiting("", 0, (), joined, missing, self._join_since))
        return out

    def _act(self, now: float) -> str | None:
        self._sample(now)  # fresh: an operation may have completed since the last sample
        check, shutdown = self.settings.check_s, self.settings.shutdown_s
        waiting = self._waiting()
        threshold = min(check, shutdown) if shutdown > 0 else check
        stalled = [w for w in waiting if w.since + threshold <= now]
        if shutdown > 0 and any(w.since + shutdown <= now for w in waiting):
            self._stopped = True
            diagnosis = describe(stalled, now)
            self._report(
                StallNotice.of(
                    f"stopping every rank after {shutdown:g} s "
                    f"(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS): {diagnosis}",
                    stalled,
                    stopping=True,
                )
            )
            return (
                f"Horovod has been shut down: collectives stalled for {shutdown:g} s "
                f"(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS): {diagnosis}. Every rank must submit the "
                "same collectives under the same names; a rank with no more data calls hvd.join()."
            )
        stalled = [w for w in waiting if w.since + check <= now]
        if not stalled:
            if self._warning_stands:
                self._warning_stands = False
                self._report(None)
            return None
        if self._last_warning is None or self._last_warning + check <= now:
            self._last_warning = now
            self._warning_stands = True
            ending = (
                f"every rank is stopped at {shutdown:g} s (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)"
                if shutdown > 0
                else "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=0: nothing will stop them"
            )
            self._report(
                StallNotice.of(
                    f"{describe(stalled, now)}. Ranks that submit different names, or a rank "
                    f"that skips a collective, wait forever; {ending}.",
                    stalled,
                )
            )
        return None
