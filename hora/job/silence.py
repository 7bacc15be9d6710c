"""A rank's silence: how long the driver waits for a word from a running rank before it takes
its host as cut off (or the process as frozen).

A running rank says a word at least every 2 s (a heartbeat when it has said nothing else:
hora.rank.worker), which its channel notes (`Connection.heard_at`); without it a cut-off host's
ranks would wait in their collectives for ever, and the driver with them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from hora.job.failures import Failure
from hora.wire.channel import Connection

SILENCE_VAR = "HORA_HEARTBEAT_TIMEOUT_SECONDS"
DEFAULT_SILENCE_SECONDS = 30.0


class Heard(Protocol):
    """What of the monitor the silence is judged from: when it handled a rank's last message,
    and when its channel last carried one (a heartbeat goes no further)."""

    last_heard: dict[int, float]
    failures: dict[int, Failure]
    started: dict[int, str]

    @property
    def connections(self) -> Mapping[int, Connection]: ...


def silent(
    heard: Heard, now: float, silence_s: float, finished: Callable[[int], bool]
) -> tuple[dict[int, Failure], float]:
    """The failures of the running ranks not heard from for `silence_s` (0: never), each
    naming its host; and the first time another could be (no look is needed before it)."""
    found: dict[int, Failure] = {}
    if not silence_s:
        return found, float("inf")
    due = now + silence_s  # a rank that says hello later cannot be silent before it either
    connections = heard.connections
    for rank, when in heard.last_heard.items():
        conn = connections.get(rank)
        quiet = now - (when if conn is None else max(when, conn.heard_at))
        if quiet < silence_s:
            due = min(due, now - quiet + silence_s)
            continue
        if rank in heard.failures or finished(rank):
            continue
        host = heard.started.get(rank, "?")
        found[rank] = Failure(
            rank,
            f"no word from it for {quiet:.0f} s ({SILENCE_VAR}={silence_s:g}): host {host} is "
            "unreachable (network cut, or the host is gone) or the process is frozen",
            "",
            False,
            time.time(),
            subject=f"rank {rank} on host {host}",
        )
    return found, due


def silence_seconds() -> float:
    """How long a running rank may stay silent (0: never judged silent)."""
    value = os.environ.get(SILENCE_VAR, "")
    try:
        return float(value) if value else DEFAULT_SILENCE_SECONDS
    except ValueError:
        raise ValueError(f"{SILENCE_VAR}={value!r} is not a number of seconds") from None
