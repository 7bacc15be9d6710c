"""Worker functions specific to the Ray engine's tests (the shared ones are tests._workers)."""

from __future__ import annotations

import os
import signal
import time


def place() -> dict[str, str | None]:
    """Where this rank is, as the contract tells it, and who started it."""
    print(f"hello from rank {os.environ['RANK']}", flush=True)
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "OMP_NUM_THREADS", "USER_VAR")
    found: dict[str, str | None] = {name: os.environ.get(name) for name in names}
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        found["parent"] = f.read().replace(b"\0", b" ").decode()
    return found


def kill_own_actor_on_first_attempt(rank: int) -> str:
    """`rank` kills the Ray actor supervising it (as a lost node would) in the first attempt;
    the rank itself lives on, and must be stopped by hora all the same."""
    if os.environ["HORA_RESTART_COUNT"] == "0":
        if int(os.environ["RANK"]) == rank:
            os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(3600)
    return f"attempt {os.environ['HORA_RESTART_COUNT']} done"
