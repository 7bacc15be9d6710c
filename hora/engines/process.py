"""One worker process: started in its own session, its output pumped line by line, killed whole.

Shared by every engine: the local launcher starts these on the driver, the Spark engine inside
each barrier task, so a fresh interpreter (with CUDA_VISIBLE_DEVICES already set) runs the job.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import IO

from hora._deepspeed_ops import remove_segments_left
from hora.wire.protocol import Boot

OnLine = Callable[[str, str], None]  # (stream name, line without its newline)
OnExit = Callable[[int], None]  # the return code: negative for a signal

_PUMP_GRACE_SECONDS = 1.0
#: how long a worker gets between SIGTERM and SIGKILL when its attempt stops (`stop_all`); a
#: launcher that tells supervisors to stop waits that long, and a little more, for them
STOP_GRACE_SECONDS = 3.0


class WorkerProcess:
    """`python -m hora.rank.worker` for one rank; `on_exit` fires after its last output line.
    `python`: the interpreter that runs it, this one unless the engine's ranks run another
    (which then finds hora where `env`'s PYTHONPATH says: `hora.engines.rank_pythonpath`)."""

    def __init__(
        self,
        boot: Boot,
        env: Mapping[str, str],
        on_line: OnLine,
        on_exit: OnExit,
        cwd: str | None = None,
        python: str | None = None,
    ):
        self._proc = subprocess.Popen(
            [python or sys.executable, "-u", "-m", "hora.rank.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,  # its own process group: one signal reaches all it started
        )
        self.pid = self._proc.pid
        #: the rendezvous its frameworks name their shared memory after (`stop_all` removes it)
        self.master = (env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", ""))
        assert self._proc.stdin is not None
        self._proc.stdin.write(boot.to_line().encode())
        self._proc.stdin.close()
        self._pumps = [
            threading.Thread(target=_pump, args=(stream, name, on_line), daemon=True)
            for stream, name in ((self._proc.stdout, "stdout"), (self._proc.stderr, "stderr"))
        ]
        for pump in self._pumps:
            pump.start()
        self._waiter = threading.Thread(target=self._wait, args=(on_exit,), daemon=True)
        self._waiter.start()

    def _wait(self, on_exit: OnExit) -> None:
        code = self._proc.wait()
        # A grandchild holding the pipes open must not delay the news of this death for long.
        for pump in self._pumps:
            pump.join(timeout=_PUMP_GRACE_SECONDS)
        on_exit(code)

    def poll(self) -> int | None:
        return self._proc.poll()

    def signal_group(self, sig: int) -> None:
        """Signal the worker and everything it started (same process group)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def join(self, timeout: float | None = None) -> None:
        self._waiter.join(timeout)
        for pump in self._pumps:
            pump.join(timeout)
        if not any(pump.is_alive() for pump in self._pumps):
            for stream in (self._proc.stdout, self._proc.stderr):
                if stream is not None:
                    stream.close()


def _pump(stream: IO[bytes], name: str, on_line: OnLine) -> None:
    """Pass on the stream's text a line at a time, as it comes. A carriage return ends a line
    too (a progress bar redrawing itself), and the line keeps it, so the driver redraws the
    rank's line with its prefix; "\r\n" is one line end."""
    fd = stream.fileno()
    pending = b""
    while True:
        if pending.endswith(b"\r") and not select.select([fd], [], [], _CR_WAIT_SECONDS)[0]:
            if pending != b"\r":  # no "\n" follows: a redraw
                on_line(name, pending.decode(errors="replace"))
            pending = b""
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            break
        lines, pending = split_lines(pending + chunk)
        for line in lines:
            on_line(name, line)
    if pending.strip(b"\r"):
        on_line(name, pending.decode(errors="replace"))


_CR_WAIT_SECONDS = 0.05  # how long a trailing "\r" waits for a "\n" that would make it "\r\n"
_LINE_END = re.compile(rb"\r\n|\n|\r(?=.)", re.DOTALL)


def split_lines(data: bytes) -> tuple[list[str], bytes]:
    """The complete lines in `data`, and the rest. A line ended by "\n" or "\r\n" comes
    without its end, one ended by a lone "\r" with it; an empty one of those is dropped (tqdm
    begins each redraw with "\r"). A final "\r" stays in the rest: a "\n" may follow."""
    lines: list[str] = []
    start = 0
    for end in _LINE_END.finditer(data):
        text = data[start : end.start()].decode(errors="replace")
        start = end.end()
        if end.group() != b"\r":
            lines.append(text)
        elif text:
            lines.append(text + "\r")
    return lines, data[start:]


def stop_all(workers: list[WorkerProcess], grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM every worker's group, SIGKILL what is left after `grace` seconds, and reap them;
    then remove what their frameworks leave on this host after a kill (DeepSpeed's shared
    memory, named after the rendezvous: `hora._deepspeed_ops.remove_segments_left`)."""
    alive = [w for w in workers if w.poll() is None]
    for worker in alive:
        worker.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [w for w in alive if w.poll() is None]
    for worker in workers:
        # Also the group of a worker that already exited: its children may still be around.
        worker.signal_group(signal.SIGKILL)
    for worker in workers:
        worker.join(timeout=5)
    for addr, port in {worker.master for worker in workers}:
        if addr and port:
            remove_segments_left((addr, port))


def describe_exit(code: int) -> str:
    """How a story says a process ended: "exited with status 3", "killed by signal 9 (SIGKILL)"."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {-code} ({name})"
    return f"exited with status {code}"
