"""Processes found by a variable in their environment: how the tests find what they started,
grandchildren and orphans included (tests/conftest.py's session tag, tests/cluster's slot tag)."""

from __future__ import annotations

import os


def pids_with_env(name: str, value: str, zombies: bool = True) -> list[int]:
    """PIDs of processes (other than this one) whose environment has `name=value`; without
    zombies where `zombies` is False."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            if not zombies:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                        continue
        except OSError:
            continue
        found.append(int(entry))
    return found
