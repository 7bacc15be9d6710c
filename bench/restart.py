"""Restart latency: from a rank's SIGKILL to the end of the next attempt's first training step.

Local: the same script (`bench/restart_train.py`, checkpoint every 5 steps, rank 1 killed at step
17, resumed from the step-15 checkpoint) under `hora run -np 2 --max-restarts 1` and under
`python -m torch.distributed.run --standalone --nproc-per-node 2 --max-restarts 1`, alternating.
Spark (`--spark`, `local-cluster[2,1,1024]`): `Runner(np=2, max_restarts=1)` restarting by itself,
against what a user does without it: the run fails (`max_restarts=0`), and a fresh `Runner.run`
resumes from the same checkpoint at once. Prints medians, the ratio, and where the time went
(kill -> new process started -> checkpoint loaded -> first step done).

    .venv/bin/python bench/restart.py [--reps 3] [--spark]

Everything binds to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

TRY_SECONDS = 90  # one launch: ~10-20 s here
FAILURES: dict[str, list[str]] = {}  # launcher -> why each failed try failed
HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "restart_train.py"
sys.path.insert(0, str(HERE))


def measure(folder: Path) -> dict[str, float]:
    """Seconds from the kill to: the new rank 0 process, torch imported, the process group up,
    the checkpoint loaded, the first step done ("total")."""
    kill = json.loads((folder / "kill.json").read_text())["time"]
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    after = [e for e in events if e["start"] > 0]
    assert len(after) == 1, f"expected one resumed attempt, got {events}"
    e = after[0]
    assert e["start"] == 16, e  # resumed after the step-15 checkpoint
    return {
        "total": e["first_step"] - kill,
        "to process": e["created"] - kill,
        "to imported": e["imported"] - kill,
        "to connected": e["connected"] - kill,
        "to loaded": e["loaded"] - kill,
    }


def run_command(command: list[str], folder: Path, tries: int = 3) -> dict[str, float] | None:
    """Run the launcher; a run that failed or hung is reported and run again in a fresh folder
    (torchrun's restart does, here: see bench/README.md). None when every try failed."""
    for _ in range(tries):
        for entry in folder.rglob("*"):
            if entry.is_file():
                entry.unlink()
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a hung launcher is killed with all its workers
        )
        try:
            _out, err = proc.communicate(timeout=TRY_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _kill_workers_of(folder)  # torchrun starts its workers in sessions of their own
            _out, err = proc.communicate()
            err += f"\nhung: killed after {TRY_SECONDS} s"
        if proc.returncode == 0:
            return measure(folder)
        FAILURES.setdefault(command[2], []).append(_cause(err))
        print(f"  {command[2]} failed ({FAILURES[command[2]][-1]}); run again", flush=True)
    return None


def _cause(err: str) -> str:
    keys = ("hung:", "Error: ", "Error(")
    lines = [line.strip() for line in err.splitlines() if any(k in line for k in keys)]
    lines = [line for line in lines if "ChildFailedError" not in line]
    return lines[-1][:200] if lines else "no error line"


def _kill_workers_of(folder: Path) -> None:
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        if str(folder) in (proc.info["cmdline"] or ()):
            proc.kill()


def hora_local(folder: Path) -> dict[str, float]:
    command = [sys.executable, "-m", "hora", "run", "-np", "2", "--max-restarts", "1"]
    return run_command([*command, str(SCRIPT), str(folder)], folder)


def torchrun_local(folder: Path) -> dict[str, float]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", "--max-restarts", "1", "--master-addr", "127.0.0.1"]
    return run_command([*command, str(SCRIPT), str(folder)], folder)


def hora_spark_restart(folder: Path) -> dict[str, float]:
    import restart_train

    import hora

    hora.Runner(np=2, max_restarts=1).run(restart_train.main, folder=str(folder))
    return measure(folder)


def hora_spark_fresh(folder: Path) -> dict[str, float]:
    import restart_train

    import hora

    # The run fails (what the user sees); they run it again, from the same checkpoint.
    with contextlib.suppress(hora.WorkerFailedError):
        hora.Runner(np=2).run(restart_train.main, folder=str(folder))
    hora.Runner(np=2).run(restart_train.main, folder=str(folder))
    return measure(folder)


def compare(name_a: str, a: Callable, name_b: str, b: Callable, reps: int) -> None:
    runs: dict[str, list[dict[str, float]]] = {name_a: [], name_b: []}
    for rep in range(reps):
        for name, fn in ((name_a, a), (name_b, b)):  # alternating: load drifts hit both
            with tempfile.TemporaryDirectory(prefix="hora-restart-") as tmp:
                figures = fn(Path(tmp))
            if figures is None:
                continue
            runs[name].append(figures)
            parts = ", ".join(f"{k} {v:.2f} s" for k, v in figures.items())
            print(f"  rep {rep + 1}: {name}: {parts}", flush=True)
    medians = {}
    for name, figures in runs.items():
        medians[name] = {k: statistics.median(f[k] for f in figures) for k in figures[0]}
        parts = ", ".join(f"{k} {v:.2f} s" for k, v in medians[name].items())
        print(f"{name}: median over {reps}: {parts}")
    ratio = medians[name_a]["total"] / medians[name_b]["total"]
    print(f"ratio {name_a} / {name_b}: {ratio:.2f}x (kill -> first step of the next attempt)")
    for launcher, causes in FAILURES.items():
        print(f"{launcher}: {len(causes)} failed tries, run again: {causes}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--spark", action="store_true", help="the Spark comparison instead")
    ns = parser.parse_args()
    if not ns.spark:
        print("local, 2 ranks:")
        compare("hora run", hora_local, "torchrun", torchrun_local, ns.reps)
        return
    from launch_spark import spark_session

    session = spark_session("local-cluster[2,1,1024]")
    try:
        hora_spark_restart(Path(tempfile.mkdtemp(prefix="hora-restart-warmup-")))  # warm up
        print("Spark local-cluster[2,1,1024], 2 ranks:")
        compare("max_restarts=1", hora_spark_restart, "fresh Runner.run", hora_spark_fresh, ns.reps)
    finally:
        session.stop()
        time.sleep(1)


if __name__ == "__main__":
    main()
