"""Nothing outlives a run: interrupted drivers, killed drivers, a notebook running 30 jobs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import hora
from tests import _workers
from tests.conftest import tagged_processes, wait_for_no_processes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIVER = """
import hora
from tests import _workers
print("driver started", flush=True)
hora.run(_workers.print_then_wait_for, ("/nonexistent/marker",), np=2)
"""


def _start_driver() -> subprocess.Popen:
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert driver.stdout is not None
    seen = set()
    while len(seen) < 2:  # both workers are running user code
        line = driver.stdout.readline()
        assert line, "the driver exited before its workers started"
        if line.endswith("] ready\n"):
            seen.add(line)
    return driver


def test_ctrl_c_on_the_driver_stops_every_worker():
    driver = _start_driver()
    driver.send_signal(signal.SIGINT)
    assert driver.wait(timeout=30) != 0
    assert not wait_for_no_processes(timeout=5)


def test_workers_die_with_a_killed_driver():
    driver = _start_driver()
    assert len(tagged_processes()) >= 3  # the driver and its two workers
    driver.kill()  # no cleanup code runs in the driver: the workers must notice by themselves
    driver.wait()
    assert not wait_for_no_processes(timeout=10)


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_repeated_runs_leak_no_threads_fds_or_processes():
    hora.run(_workers.rank_times, (1,), np=2)  # warm-up: lazy imports open their files once
    threads, fds = threading.active_count(), _fd_count()
    for i in range(30):
        assert hora.run(_workers.rank_times, (i,), np=2) == [0, i]
    assert threading.active_count() == threads
    assert _fd_count() == fds
    assert not tagged_processes()


def test_repeated_failures_leak_nothing_either():
    threads, fds = threading.active_count(), _fd_count()
    for _ in range(5):
        with contextlib.suppress(hora.WorkerFailedError):
            hora.run(_workers.fail_on, (0, "raise"), np=2)
    assert threading.active_count() == threads
    assert _fd_count() == fds


def test_a_print_reaches_the_driver_while_the_worker_still_runs(tmp_path):
    """The worker waits until the driver's reader has seen its line: only live logs pass."""
    marker = tmp_path / "seen"
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER.replace("/nonexistent/marker", str(marker))],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert driver.stdout is not None
    started = time.monotonic()
    for line in driver.stdout:
        if line.endswith("] ready\n"):
            marker.touch()
    assert driver.wait(timeout=60) == 0, f"failed after {time.monotonic() - started:.1f} s"
