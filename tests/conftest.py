"""Every test must leave no hora worker process behind.

Workers inherit the driver's environment, so a tag set here marks every process this test session
starts, grandchildren included, even after they are orphaned; other sessions' workers differ.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
import venv
from pathlib import Path

import pytest

TAG = "HORA_TEST_SESSION"
os.environ[TAG] = uuid.uuid4().hex
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def tagged_processes() -> list[int]:
    """PIDs of live processes (not zombies) started under this test session's tag."""
    needle = f"{TAG}={os.environ[TAG]}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in environ.split(b"\0") and state != b"Z":
            found.append(int(entry))
    return found


def worker_processes() -> list[int]:
    """Live hora worker processes started under this test session."""
    found = []
    for pid in tagged_processes():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if b"hora._worker" in cmdline:
            found.append(pid)
    return found


def make_bare_python(folder: Path, lacks: str) -> str:
    """An interpreter of this same Python with nothing installed (no hora, cloudpickle, torch,
    pyarrow), made in `folder`; checked to lack the module `lacks`."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(folder)
    python = folder / "bin" / "python3"
    found = subprocess.run(
        [str(python), "-c", f"import importlib.util as u; print(u.find_spec({lacks!r}))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert found.stdout.strip() == "None", f"{python} has {lacks}"
    return str(python)


def wait_for_no_processes(timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := tagged_processes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.fixture(autouse=True)
def no_worker_survives(request):
    yield
    if request.node.get_closest_marker("spark"):
        return  # Spark's own JVM and Python daemons carry the tag too; its tests check workers
    if request.node.get_closest_marker("ray"):
        return  # so do Ray's GCS, raylet and workers; tests/ray checks workers, actors, groups
    left = tagged_processes()
    assert not left, f"processes left running after the test: {left}"
