"""The worker bootstrap: `python -m hora.rank.worker`, one per rank, whatever engine started it.

It reads the driver's address and the run's secret from stdin (never from the environment, which
other processes of the user can read), fetches the pickled job over the authenticated channel,
runs the engine's rank-side setup (`Boot.rank_setup`, named by the engine: the worker knows no
engine), then the job, and sends back its result or its failure. If the driver goes away first,
the worker kills its own process group: no orphan trains on after a crashed or interrupted driver.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import signal
import socket
import sys
import threading
import time
import traceback

import cloudpickle

from hora import _deepspeed_ops, _sources, elastic, environment
from hora._payload import dumps_result
from hora._script import CommandFailed
from hora.rank import stacks
from hora.wire import channel, link
from hora.wire.protocol import (
    ALLOWED,
    Boot,
    DumpStacks,
    Error,
    Heartbeat,
    Hello,
    HostsUpdated,
    Payload,
    Reform,
    Resized,
    Result,
    Stacks,
)

BOOT_ENV_FLAG = "HORA_WORKER"
_HORA_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


HEARTBEAT_SECONDS = 2.0


def _beat(conn: channel.Connection, rank: int, done: threading.Event) -> None:
    """Tell the driver every few seconds that this rank and its host are there: a host cut off
    from the network is noticed by its silence (hora.job.monitor), not by a 30-minute hang.
    Any message says so: a heartbeat goes only after HEARTBEAT_SECONDS without one (a rank
    that reports its metrics every step sends none), so a thousand ranks' frames are half as
    many at the driver."""
    while not done.wait(max(0.0, conn.sent_at + HEARTBEAT_SECONDS - time.monotonic())):
        if time.monotonic() - conn.sent_at < HEARTBEAT_SECONDS:
            continue
        try:
            conn.send(Heartbeat(rank))
        except OSError:
            return  # the driver is gone: the watcher ends this process


def _watch_driver(conn: channel.Connection, rank: int, done: threading.Event) -> None:
    """Answer the driver's questions (where are you?) while the job runs, and kill this
    worker's process group if the driver's channel closes before the job is done."""
    with contextlib.suppress(Exception):
        while True:
            message = conn.recv()
            if isinstance(message, DumpStacks):
                conn.send(Stacks(rank, stacks.dump(skip=threading.current_thread())))
            elif isinstance(message, HostsUpdated | Reform):
                elastic.hear(message)
    if not done.is_set():
        os.killpg(os.getpgid(0), signal.SIGKILL)


def _is_launcher_frame(filename: str) -> bool:
    return filename.startswith(_HORA_DIR) or filename.startswith("<frozen runpy>")


def _failure(rank: int, exc: BaseException) -> Error:
    """The failure as the user should read it: their traceback, without hora's frames on top."""
    if isinstance(exc, CommandFailed):  # a child command: its output's tail tells the story
        return Error(rank, str(exc), "", time.time())
    tb = exc.__traceback__
    while (
        tb is not None
        and tb.tb_next is not None
        and _is_launcher_frame(tb.tb_frame.f_code.co_filename)
    ):
        tb = tb.tb_next
    text = _sources.name_cells("".join(traceback.format_exception(type(exc), exc, tb)))
    summary = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return Error(rank, summary, text, time.time(), _pickled(exc))


def _pickled(exc: BaseException) -> bytes | None:
    """The exception itself, for a door that raises the remote exception (hora.distributed);
    None where it does not pickle (a lock in its arguments) or is not an Exception."""
    if not isinstance(exc, Exception):
        return None
    try:
        return cloudpickle.dumps(exc)
    except Exception:
        return None


def _run(boot: Boot, conn: channel.Connection) -> int:
    rank = boot.rank
    job: Payload = conn.recv()
    done = threading.Event()
    link.attach(link.DriverLink(conn, rank, boot.secret))  # first: the watcher may note to it
    threading.Thread(target=_watch_driver, args=(conn, rank, done), daemon=True).start()
    threading.Thread(
        target=_beat, args=(conn, rank, done), name="hora-heartbeat", daemon=True
    ).start()
    try:
        _set_up(boot)
        fn, args, kwargs = cloudpickle.loads(job.job)
        result = fn(*args, **kwargs)
    except elastic.ResizeExit as exc:  # an elastic run stopped at a commit, to resize
        return _report(conn, done, Resized(rank, exc.commit), status=0)
    except SystemExit as exc:
        if exc.code in (0, None):
            result = None
        else:
            failure = _failure(rank, exc)._replace(summary=f"called sys.exit({exc.code!r})")
            return _report(conn, done, failure)
    except BaseException as exc:
        return _report(conn, done, _failure(rank, exc))
    try:
        data = dumps_result(result, rank) if job.want_result else None
    except Exception as exc:
        return _report(conn, done, _failure(rank, exc))
    return _report(conn, done, Result(rank, data), status=0)


def _set_up(boot: Boot) -> None:
    """The engine's own setup of this rank (Spark's: pyspark's TaskContext is the rank's task),
    before the job; a failure there is the rank's failure, told as any other."""
    if boot.rank_setup:
        module, _, name = boot.rank_setup.partition(":")
        getattr(importlib.import_module(module), name)(boot)


def _report(
    conn: channel.Connection,
    done: threading.Event,
    message: Error | Result | Resized,
    status: int = 1,
) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    done.set()
    link.detach()
    conn.send(message)
    return status


def main() -> None:
    boot = Boot.from_line(sys.stdin.readline())
    sys.path.extend(p for p in boot.sys_path if p not in sys.path)
    os.environ[BOOT_ENV_FLAG] = "1"
    os.environ.update(environment.task_view(os.environ))  # before anything reads them
    _deepspeed_ops.build_once_per_host()
    conn = channel.connect(boot.address, boot.secret, ALLOWED)
    conn.send(Hello(boot.rank, os.getpid(), socket.gethostname()))
    status = _run(boot, conn)
    conn.close()
    # Tearing down an interpreter that imported torch takes ~0.3 s and helps nobody; the atexit
    # handlers (the user's, torch's) still run, then the process ends without the teardown.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    main()
