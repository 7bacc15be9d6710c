"""The driver at scale, simulated: hora's real driver against N simulated ranks.

`measure_driver(n)` runs `hora.run(..., backend="sim")` as any run: the real `hora.job` driver
and monitor, the job channel's server (`hora.wire.channel`) and the launcher's TCPStore, facing
`n` ranks that a few processes simulate (tests/scale/_sim_ranks.py: each multiplexes hundreds of
sockets, speaks the real job-channel protocol and runs hora's own rank-side presence barrier on
the store; no torch tensors, no gloo). The "sim" engine is written on hora's public engine face
(`hora.engines`, docs/engines.md), as a third party's would be.

The run is elastic (min_np = n - 2, max_np = n, so it never grows) and goes through:

1. launch: `ready_s`, from `run()` to every rank holding its job and past the store's barrier;
   `store_ops_per_rank`, the store operations hora's code made per rank on the way;
2. steady state, every rank running (a metric every `metrics_s` and a line every `output_s`,
   a heartbeat as a real rank sends it: after 2 s without another message, or every 2 s with
   `beats="always"`, as hora's ranks did before): `driver_cpu_percent`, this process's CPU
   (the driver, its channel, the store's server, the launcher's pumps; % of one core) over
   `steady_s`;
3. one rank's process ends: `detect_exit_s`, from its sockets' close to the driver's verdict
   naming it (the line "resizing in place ... (rank r failed ..."); `reform_s`, from the loss to
   every survivor told its new place and past the new world's barrier (Formed);
4. another rank goes silent, its socket open: `detect_hang_s`, from its last message to the
   verdict naming it (HORA_HEARTBEAT_TIMEOUT_SECONDS is `hang_timeout_s` here); the attempt
   then ends (a silent rank is never dropped in place) and run() raises, naming it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import hora
from hora import engines
from hora.engines import AttemptSpec, Capabilities, Engine, LaunchContext, Launcher, RanksRun
from hora.errors import WorkerFailedError
from hora.job.silence import SILENCE_VAR

LOOPBACK = "127.0.0.1"
RANKS_PER_PROCESS = 256
RANKS_PER_HOST = 8  # each simulated process holds many hosts' ranks, 8 to a host (a GPU node)
HEARTBEAT_S = 2.0  # hora.rank.worker's HEARTBEAT_SECONDS
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: the launchers running now (the harness commands their simulated ranks)
RUNNING: list[SimLauncher] = []


def capacity(spec: AttemptSpec, held: int) -> int:
    """The simulated cluster has room for every rank the run may have."""
    return spec.most_ranks


def _no_job() -> None:
    """The job the simulated ranks are handed (and never run)."""


class SimLauncher(Launcher):
    """`np` simulated ranks in a few processes of this machine; their store is hosted here."""

    capabilities = Capabilities(
        ranks_run=RanksRun.ON_CLUSTER, reforms_in_place=True, exact_count=True
    )

    def __init__(self, spec: AttemptSpec) -> None:
        self.spec = spec
        self.options = dict(spec.options)
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._procs: list[tuple[subprocess.Popen[bytes], set[int]]] = []
        self._pumps: list[threading.Thread] = []
        self._store: Any = None
        self._lock = threading.Lock()

    def start(self, ctx: LaunchContext) -> None:
        self._store, port = engines.host_store(LOOPBACK)
        np = self.spec.np
        per = -(-np // max(1, -(-np // RANKS_PER_PROCESS)))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([_hora_root(), _REPO]))
        env["TORCH_CPP_LOG_LEVEL"] = "ERROR"  # c10d's warnings of every client socket
        # torch reverse-resolves the address of every store connection it makes (for its logs;
        # pytorch#159007): where the resolver drops a query (this VM's does, ~3%), a rank's
        # client waits 5-10 s for it. One try of 1 s, and torch stops asking for that process.
        env["RES_OPTIONS"] = "timeout:1 attempts:1"
        for first in range(0, np, per):
            ids = list(range(first, min(np, first + per)))
            p = len(self._procs)
            config = {
                "address": list(ctx.address),
                "secret": ctx.secret.hex(),
                "store_port": port,
                "ids": ids,
                "hosts": {str(i): f"sim{p}-{i // RANKS_PER_HOST}" for i in ids},
                "size": np,
                "t0": time.monotonic(),
                "seed": p,
                "wait_s": self.options.get("wait_s", 120.0),
                "heartbeat_s": HEARTBEAT_S,
                "metrics_s": self.options.get("metrics_s", 2.0),
                "output_s": self.options.get("output_s", 10.0),
                "start_barrier": self.options.get("start_barrier", True),
                "beats": self.options.get("beats", "when quiet"),
            }
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.scale._sim_ranks"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                cwd=_REPO,
                start_new_session=True,
            )
            assert proc.stdin is not None
            proc.stdin.write((json.dumps(config) + "\n").encode())
            proc.stdin.flush()
            self._procs.append((proc, set(ids)))
            pump = threading.Thread(target=self._pump, args=(proc, ctx), daemon=True)
            pump.start()
            self._pumps.append(pump)
        RUNNING.append(self)

    def _pump(self, proc: subprocess.Popen[bytes], ctx: LaunchContext) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            kind, _, rest = raw.decode(errors="replace").rstrip("\n").partition(" ")
            if kind == "OUT":
                ident, stream, text = rest.split(" ", 2)
                ctx.report(engines.Output(int(ident), stream, text))
            elif kind == "EXIT":
                ident, code = rest.split(" ")
                ctx.report(engines.Exited(int(ident), int(code)))
            elif kind == "EV":
                self.events.put(json.loads(rest))

    def command(self, what: str, ident: int) -> None:
        """Tell the process that holds rank `ident` to make it `exit` or `hang`."""
        for proc, ids in self._procs:
            if ident in ids and proc.stdin is not None:
                with self._lock:
                    proc.stdin.write(f"{what} {ident}\n".encode())
                    proc.stdin.flush()

    def stop(self) -> None:
        for proc, _ in self._procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
        for proc, _ in self._procs:
            proc.wait()
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        for pump in self._pumps:
            pump.join(timeout=5)
        for proc, _ in self._procs:
            if proc.stdout is not None:
                proc.stdout.close()
        self._procs, self._pumps, self._store = [], [], None
        if self in RUNNING:
            RUNNING.remove(self)


def _hora_root() -> str:
    """The folder hora is imported from here (the simulated ranks import the same one)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(hora.__file__)))


SIM = Engine(
    name="sim",
    is_active=lambda: False,
    launcher=f"{__name__}:SimLauncher",
    capacity=f"{__name__}:capacity",
    options={
        "metrics_s": "seconds between a rank's metrics",
        "output_s": "seconds between a rank's output lines",
        "wait_s": "the store barrier's wait",
        "start_barrier": "whether the ranks gather through hora's barrier at start",
        "beats": "'when quiet' (a heartbeat after 2 s without another message: hora.rank.worker"
        " since issue 45) or 'always' (every 2 s: before)",
    },
    summary="simulated ranks (tests/scale)",
)


class _Lines(io.TextIOBase):
    """The driver's stdout/stderr while measured: hora's own lines kept with their time."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        now = time.monotonic()
        self._partial += text
        *whole, self._partial = self._partial.split("\n")
        self.lines += [(now, line) for line in whole if line.startswith("hora: ")]
        return len(text)

    def first(self, pattern: str, after: float = 0.0) -> tuple[float, str] | None:
        """The first of hora's lines since `after` that `pattern` finds, and its time."""
        found = re.compile(pattern)
        lines = list(self.lines)
        return next(((t, line) for t, line in lines if t >= after and found.search(line)), None)


def _wait(what: str, predicate: Any, timeout: float, poll: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"the simulation waited {timeout:g} s for {what}")


@dataclass
class Simulation:
    """One simulated run of `n` ranks and what it showed: the figures, the driver's verdict
    lines, each survivor's place in the re-formed world and the error the run ended with."""

    n: int
    steady_s: float = 6.0
    hang_timeout_s: float = 3.0
    options: dict[str, Any] = field(default_factory=dict)
    start_timeout: float = 300.0
    figures: dict[str, float] = field(default_factory=dict)
    verdicts: dict[str, str] = field(default_factory=dict)  # "exit"/"hang" -> the driver's line
    places: dict[int, int] = field(default_factory=dict)  # survivor's id -> its rank re-formed
    error: BaseException | None = None
    gone: int = 0  # the rank whose process exits
    silent: int = 0  # the rank that hangs

    def __post_init__(self) -> None:
        self.gone, self.silent = self.n // 2, self.n // 4
        self._lines = _Lines()
        self._seen: dict[str, dict[int, dict[str, Any]]] = {}
        self._launcher: SimLauncher | None = None

    def run(self) -> Simulation:
        engines.register(SIM, override=True)
        saved = sys.stdout, sys.stderr, os.environ.get(SILENCE_VAR)
        os.environ[SILENCE_VAR] = f"{self.hang_timeout_s:g}"
        sys.stdout = sys.stderr = self._lines
        driver = threading.Thread(target=self._drive, name="sim-driver", daemon=True)
        try:
            began = time.monotonic()
            driver.start()
            self._launcher = _wait("the launcher", lambda: RUNNING[-1] if RUNNING else None, 60)
            self._launched(began)
            self._steady()
            self._exit()
            self._hang()
            driver.join(timeout=120)
        finally:
            sys.stdout, sys.stderr = saved[0], saved[1]
            if saved[2] is None:
                os.environ.pop(SILENCE_VAR, None)
            else:
                os.environ[SILENCE_VAR] = saved[2]
            for running in list(RUNNING):
                running.stop()
            driver.join(timeout=60)
            with contextlib.suppress(KeyError):
                engines.unregister(SIM.name)
        return self

    def _drive(self) -> None:
        n = self.n
        try:
            hora.run(_no_job, np=n, min_np=max(1, n - 2), max_np=n, backend="sim",
                     engine_options=self.options, start_timeout=self.start_timeout,
                     max_restarts=0)  # fmt: skip
        except BaseException as error:
            self.error = error

    def _collect(self, kind: str, count: int) -> dict[int, dict[str, Any]]:
        """The simulated ranks' events of `kind`, once `count` of them came."""
        assert self._launcher is not None
        while len(self._seen.get(kind, {})) < count:
            if self.error is not None:
                raise RuntimeError(f"the run ended: {self.error}")
            try:
                ev = self._launcher.events.get(timeout=0.1)
            except queue.Empty:
                continue
            for key in ("ready", "lost", "hung", "formed", "reform", "barrier_failed"):
                if key in ev:
                    self._seen.setdefault(key, {})[ev[key]] = ev
            if "barrier_failed" in self._seen:
                raise RuntimeError(f"a barrier failed: {self._seen['barrier_failed']}")
        return self._seen[kind]

    def _launched(self, began: float) -> None:
        ready = self._collect("ready", self.n)
        self.figures["ready_s"] = max(e["t"] for e in ready.values()) - began
        self.figures["jobs_s"] = max(e["job"] for e in ready.values()) - began
        self.figures["store_ops_per_rank"] = sum(e["ops"] for e in ready.values()) / self.n

    def _steady(self) -> None:
        """This process's CPU (the driver, its channel, the store's server, the launcher's
        pumps) while every rank runs."""
        time.sleep(2.0)  # every rank's first heartbeat and metric are in
        before, began = os.times(), time.monotonic()
        time.sleep(self.steady_s)
        after, wall = os.times(), max(1e-9, time.monotonic() - began)
        used = after.user + after.system - before.user - before.system
        self.figures["driver_cpu_percent"] = used / wall * 100
        self.figures["driver_system_percent"] = (after.system - before.system) / wall * 100

    def _exit(self) -> None:
        assert self._launcher is not None
        self._launcher.command("exit", self.gone)
        lost_at = self._collect("lost", 1)[self.gone]["t"]
        pattern = rf"resizing in place .*\(rank {self.gone} failed"
        verdict = _wait("the exit's verdict", lambda: self._lines.first(pattern, lost_at), 60)
        self.verdicts["exit"] = verdict[1]
        formed = self._collect("formed", self.n - 1)
        self.places = {ident: e["rank"] for ident, e in formed.items()}
        self.figures["detect_exit_s"] = verdict[0] - lost_at
        self.figures["reform_s"] = max(e["t"] for e in formed.values()) - lost_at
        time.sleep(1.0)

    def _hang(self) -> None:
        assert self._launcher is not None
        self._launcher.command("hang", self.silent)
        quiet_since = self._collect("hung", 1)[self.silent]["t"]
        pattern = rf"rank {self.silent} on host \S+: no word from it"
        wait = self.hang_timeout_s + 60
        verdict = _wait("the hang's verdict", lambda: self._lines.first(pattern, quiet_since), wait)
        self.verdicts["hang"] = verdict[1]
        self.figures["detect_hang_s"] = verdict[0] - quiet_since
        self.figures["hang_timeout_s"] = self.hang_timeout_s


def measure_driver(n: int, **options: Any) -> dict[str, float]:
    """One simulated run of `n` ranks, measured as the module's docstring says: the six keys
    (and `n`, `jobs_s`, `driver_system_percent`, `hang_timeout_s`). Options: `steady_s`,
    `hang_timeout_s`, `start_timeout`, and the engine's (`metrics_s`, `output_s`, `wait_s`,
    `start_barrier`)."""
    own = {
        k: options.pop(k) for k in ("steady_s", "hang_timeout_s", "start_timeout") if k in options
    }
    simulation = Simulation(n, options=options, **own).run()
    error = simulation.error
    if not isinstance(error, WorkerFailedError) or f"rank {simulation.silent} on host" not in str(
        error
    ):
        raise RuntimeError(f"the run did not end naming rank {simulation.silent}: {error!r}")
    return {"n": float(n), **simulation.figures}


if __name__ == "__main__":
    for size in [int(a) for a in sys.argv[1:]] or [16]:
        print(json.dumps(measure_driver(size)), flush=True)
