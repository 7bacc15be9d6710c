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
from tests import _driver_death, _workers
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


def test_a_killed_drivers_ranks_and_their_children_are_gone_within_seconds(tmp_path):
    """The driver SIGKILLed mid-run (no code of it runs): both ranks see its channel close and
    kill their process groups, the child each started with them, in far less than the
    heartbeat silence time; the shared memory they met in was unlinked once mapped, so
    nothing of the run is left in /dev/shm either."""
    segments = _driver_death.hora_segments()
    driver = _driver_death.start_driver(tmp_path, "local", str(tmp_path))
    try:
        ranks = _driver_death.wait_for_ranks(driver, np=2)
        assert {r["parent"] for r in ranks} == {driver.proc.pid}, ranks
        assert all(r["shm"] for r in ranks), ranks  # they did meet in shared memory
        pids = [pid for r in ranks for pid in (r["pid"], r["child"])]
        took = _driver_death.kill_and_time(driver, pids)
        left = driver.tagged()
    finally:
        driver.stop()
    print(f"local: the ranks and their children gone {took:.2f} s after the driver was killed")
    assert not left
    assert not _driver_death.segments_left(ranks)
    assert _driver_death.hora_segments() <= segments


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
