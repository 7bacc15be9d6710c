"""A rank's silence: how long the driver waits for a word from a running rank before it takes
its host as cut off (or the process as frozen).

A running rank says a word at least every 2 s (a heartbeat when it has said nothing else:
hora.rank.worker), which its channel notes (`Connection.heard_at`); without it a cut-off host's
ranks would wait in their collectives for ever, and the driver with them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from hora.job.failures import Failure
from hora.job.records import RankRecord

SILENCE_VAR = "HORA_HEARTBEAT_TIMEOUT_SECONDS"
DEFAULT_SILENCE_SECONDS = 30.0


def silent(
    ranked: Iterable[tuple[int, RankRecord]], now: float, silence_s: float
) -> tuple[dict[int, Failure], float]:
    """The failures of the running ranks (rank now, record) not heard from for `silence_s`
    (0: never), each naming its host; and the first time another could be (no look is needed
    before it)."""
    found: dict[int, Failure] = {}
    if not silence_s:
        return found, float("inf")
    due = now + silence_s  # a rank that says hello later cannot be silent before it either
    for rank, record in ranked:
        conn = record.connection
        if record.host is None:
            continue  # not connected: the start timeout is its limit
        heard = record.last_heard if conn is None else max(record.last_heard, conn.heard_at)
        quiet = now - heard
        if quiet < silence_s:
            due = min(due, heard + silence_s)
            continue
        if record.failure is not None or record.finished:
            continue
        found[rank] = Failure(
            rank,
            f"no word from it for {quiet:.0f} s ({SILENCE_VAR}={silence_s:g}): host "
            f"{record.host} is unreachable (network cut, or the host is gone) or the process is "
            "frozen",
            "",
            False,
            time.time(),
            subject=f"rank {rank} on host {record.host}",
        )
    return found, due


def silence_seconds() -> float:
    """How long a running rank may stay silent (0: never judged silent)."""
    value = os.environ.get(SILENCE_VAR, "")
    try:
        return float(value) if value else DEFAULT_SILENCE_SECONDS
    except ValueError:
        raise ValueError(f"{SILENCE_VAR}={value!r} is not a number of seconds") from None
