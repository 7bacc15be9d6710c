"""Chaos: an elastic run whose ranks are SIGKILLed at random, every T seconds (issue 39; on the
2-host cluster, issue 47).

One job, `hora.run(train, np=4, min_np=2, max_np=4, max_restarts=100)` on the local engine:
`hvd.elastic.TorchState` holds a `hora.data` loader (ids 0..N-1, shuffled) and a "model" that
is a count per sample id; every step adds, by a sum allreduce, the one-hot counts of each rank's
batch, so the final committed model says how many times each sample was trained: it must be
`epochs` for every id, however the world was torn and re-formed. Each step also multiplies
small matrices and sleeps (`Job.pace`: ~30 ms a step, so that the world's size matters as it
would on real hardware, not only the 2 cores); a commit every 5 steps and at each epoch's end.

A chaos thread in the driver's process SIGKILLs a random rank (rank 0 included; a process among
the driver's descendants running `hora.rank.worker`) every T seconds, and only while more than
min_np of them live, so every full restart is one the goal forbids. The local engine has the
slots, and its count is exact, so the run grows back by itself at once (no settle time;
`--settle S` sets HORA_ELASTIC_SETTLE_SECONDS).
Each run is a subprocess of the bench whose output (the driver's `hora: ...` lines, the chaos'
`chaos: ...` lines; kept in the folder the header names) is read back: kills survived in place
(`resized in place from A to B`, B < A, of the `resizing in place` begun), growths in place
(the same, B > A, of the `growing in place` begun), full restarts (`attempt N of M starting`:
after a failed attempt, or to grow). A run that has not finished after 5x the failure-free
run's length (+ 60 s) stops (hora.run's timeout) and is printed as such.

Printed per T: wall time, trained samples/s and the kept (committed) steps/s, goodput (samples/s
against the failure-free run's: the same work, so its wall time over this one's), kills, in-place
shrinks and growths, full restarts, and whether every sample was trained exactly once per epoch.

    .venv/bin/python bench/chaos.py                     # T = 0 (baseline), 15, 5; ~60 s runs
    .venv/bin/python bench/chaos.py --quick --every 5   # ~25 s runs, to smoke-test
    .venv/bin/python bench/chaos.py --seconds 120 --every 30,15,10 --seed 1
    .venv/bin/python bench/chaos.py --trace             # each rank logs its steps (ids, commit)
    flock /work/cluster.lock sudo .venv/bin/python bench/chaos.py --engine spark [--kill host]

`--engine spark` or `ray` runs the same job on tests/cluster's 2 namespaced hosts x 2 slots
(bench/_chaos_cluster.py: the cluster started once for every T, the driver connected as the
cluster tests connect, `hora.run(..., backend=engine)`); the chaos, in the bench's own process
there, SIGKILLs a random rank process on a host (`--kill rank`) or every rank of a random host
(`--kill host`), only where at least min_np ranks are left; the engine's settle time applies
unless `--settle` says otherwise. The printed kills are the bench's (the child's are local).

The driver and the ranks import the hora of the tree this file is in (first on PYTHONPATH).
Wall-clock, on the shared 2-core machine: compare the rows of one run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _chaos_cluster  # bench/, first on the path of a script run from it

REPO = Path(__file__).resolve().parents[1]
NP, MIN_NP = 4, 2
LIMIT = 5  # a run stops after LIMIT x the failure-free run's length (+ 60 s)
STEP_GUESS = 0.028  # seconds per step at 4 ranks (pace + matmul + allreduce), to size the data
GOALS = (
    "every sample exactly once per epoch; zero full restarts while >= min_np ranks live "
    "(the chaos only kills with > min_np alive); goodput >= 90% at one failure per 15 s"
)


@dataclass(frozen=True)
class Job:
    """What one run trains (and its chaos): the same for every T but `every`."""

    folder: str
    samples: int
    epochs: int = 3
    batch: int = 8
    commit_every: int = 5
    work: int = 160  # the matmul's side
    pace: float = 0.02  # seconds each step sleeps beside its compute
    every: float = 0.0  # seconds between kills; 0: none
    seed: int = 0
    limit: float = 3600  # seconds: hora.run's timeout
    trace: bool = False  # each rank logs its steps to trace-<every>-<pid>.jsonl in `folder`
    engine: str = "local"  # or "spark", "ray": on the 2-host cluster (`cluster`: its address)
    cluster: dict[str, Any] = dataclasses.field(default_factory=dict)


def train(job: Job) -> dict[str, Any]:
    """The ranks' function: counts per sample id, summed over the ranks each step."""
    import torch

    import hora.torch as hvd

    hvd.init()
    torch.set_num_threads(1)  # 4 ranks on 2 cores
    data = _dataset(job.folder)
    counts = torch.nn.Module()
    counts.register_buffer("seen", torch.zeros(job.samples, dtype=torch.float64))
    loader = data.loader(job.batch, shuffle=True, seed=1, columns=["id"])
    state: Any = hvd.elastic.TorchState(counts, None, loader=loader, epoch=0, steps=0)
    a = torch.randn(job.work, job.work)

    @hvd.elastic.run
    def loop(state: Any) -> None:
        while state.epoch < job.epochs:
            state.loader.set_epoch(state.epoch)  # a resumed epoch keeps its position
            for j, batch in enumerate(state.loader):
                mine = torch.bincount(batch["id"], minlength=job.samples).double()
                state.model.seen += hvd.allreduce(mine, op=hvd.Sum, name="seen")
                for _ in range(4):
                    (a @ a).sum().item()
                time.sleep(job.pace)
                state.steps += 1
                if job.trace:
                    _trace(job, state, batch["id"].tolist())
                if (j + 1) % job.commit_every == 0:
                    state.commit()
            state.epoch += 1
            state.commit()

    loop(state)
    seen = counts.get_buffer("seen").tolist()  # the state's model: the last commit's, synced
    return {"seen": seen, "steps": state.steps, "world": hvd.size()}


def _trace(job: Job, state: Any, ids: list[int]) -> None:
    """One step as this rank saw it: to find which steps a wrong count came from."""
    import hora.torch as hvd

    here: dict[str, Any] = {"attempt": os.environ.get("HORA_RESTART_COUNT"), "world": hvd.size()}
    here |= {"generation": os.environ.get("HORA_WORLD_GENERATION"), "rank": hvd.rank()}
    here |= {"epoch": state.epoch, "commit": state.commit_index, "t": time.time(), "ids": ids}
    with Path(job.folder, f"trace-{job.every:g}-{os.getpid()}.jsonl").open("a") as f:
        f.write(json.dumps(here) + "\n")


def _dataset(folder: str) -> Any:
    import hora.data

    return hora.data.from_parquet(Path(folder, "data"))


def write_data(folder: str, samples: int) -> None:
    """Ids 0..samples-1 in 4 Parquet files of row groups of 256."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    Path(folder, "data").mkdir(parents=True)
    for part, ids in enumerate(np.array_split(np.arange(samples, dtype=np.int64), 4)):
        pq.write_table(pa.table({"id": ids}), Path(folder, "data", f"part-{part}.parquet"), 256)


# ----- the driver's side: one run, in a subprocess of the bench ---------------------------------
def workers() -> list[Any]:
    """This process's live descendants that run a rank."""
    import psutil  # type: ignore[import-untyped]

    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "hora.rank.worker" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            continue  # gone meanwhile
    return found


def local_victims() -> list[list[Any]]:
    """One rank at a time, among this process's descendants."""
    return [[p] for p in workers()]


def chaos(
    every: float,
    seed: int,
    stop: threading.Event,
    kills: list[float],
    victims: Callable[[], list[list[Any]]] = local_victims,
) -> None:
    """Every `every` seconds, SIGKILL one random group of `victims()` (a rank, or a host's
    ranks), once at least MIN_NP ranks would be left."""
    rng, start = random.Random(seed), time.monotonic()
    while not stop.wait(every):
        while not stop.is_set() and not (choices := _killable(victims())):
            time.sleep(0.1)
        if stop.is_set():
            return
        group, alive = rng.choice(choices[0]), choices[1]
        killed = []
        for victim in group:
            with contextlib.suppress(Exception):  # psutil.NoSuchProcess: it ended meanwhile
                victim.kill()
                killed.append(victim.pid)
        if not killed:
            continue
        kills.append(time.monotonic() - start)
        print(
            f"chaos: {kills[-1]:.1f} s: SIGKILL pid {', '.join(map(str, killed))} "
            f"({alive} ranks alive)",
            file=sys.stderr,
            flush=True,
        )


def _killable(groups: list[list[Any]]) -> tuple[list[list[Any]], int] | None:
    """The groups whose kill leaves at least MIN_NP ranks alive, and how many live; None: none."""
    alive = sum(len(g) for g in groups)
    choices = [g for g in groups if g and alive - len(g) >= MIN_NP]
    return (choices, alive) if choices else None


def one_run(job: Job, out: str) -> None:
    """The child: hora.run with the chaos thread beside it; what it saw, as JSON in `out`."""
    import hora

    print(f"chaos: hora from {Path(hora.__file__).parent}", file=sys.stderr, flush=True)
    if job.engine != "local":
        import _chaos_cluster

        _chaos_cluster.connect(job.engine, job.cluster)
    kills: list[float] = []
    stop = threading.Event()
    thread = threading.Thread(target=chaos, args=(job.every, job.seed, stop, kills), daemon=True)
    start = time.monotonic()
    if job.every and job.engine == "local":  # on the cluster, the bench's process kills
        thread.start()
    record: dict[str, Any] = {}
    try:
        results = hora.run(
            train,
            (job,),
            np=NP,
            min_np=MIN_NP,
            max_np=NP,
            max_restarts=100,
            timeout=job.limit,
            backend=job.engine,
        )
    except Exception as error:  # past the limit, or out of restarts: a row all the same
        record["error"] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    finally:
        stop.set()
    record |= {"wall": time.monotonic() - start, "kills": len(kills)}
    if "error" not in record:
        seen = results[0]["seen"]
        record["agree"] = all(r["seen"] == seen for r in results)
        record["wrong"] = sum(1 for c in seen if c != job.epochs)
        record["counts"] = {f"{c:g}": n for c, n in sorted(Counter(seen).items())}  # -> ids
        record |= {"steps": results[0]["steps"], "world": [r["world"] for r in results]}
    Path(out).write_text(json.dumps(record))


def lines(err: str) -> dict[str, int]:
    """The driver's story: worlds re-formed in place and full restarts (hora/job's texts)."""

    def n(pattern: str) -> int:
        return len(re.findall(pattern, err, re.MULTILINE))

    resized = re.findall(r"^hora: resized in place from (\d+) to (\d+) ranks", err, re.MULTILINE)
    return {
        "shrinking": n(r"^hora: resizing in place from \d+ to \d+ ranks"),
        "shrunk": sum(int(b) < int(a) for a, b in resized),
        "growing": n(r"^hora: growing in place from \d+ to \d+ ranks"),
        "grown": sum(int(b) > int(a) for a, b in resized),
        "failed": n(r"^hora: attempt \d+ of \d+ failed"),
        "grown_by_restart": n(r"^hora: resizing from \d+ to \d+ ranks \(free slots"),
        "restarts": n(r"^hora: attempt \d+ of \d+ starting"),
    }


def measure(
    job: Job, keep: Path, settle: str | None, victims: Callable[[], list[list[Any]]] | None = None
) -> dict[str, Any]:
    """One run in a subprocess (its output kept in `keep`): its record and driver lines;
    `victims`: the chaos runs here, killing those (on the cluster)."""
    import psutil

    out = Path(job.folder, f"result-{job.every:g}.json")
    env = dict(os.environ)
    env.pop("HORA_ELASTIC_SETTLE_SECONDS", None)
    if job.engine != "local":
        for name in _chaos_cluster.LOOPBACK_VARS:
            env.pop(name, None)
    kills: list[float] = []
    stop = threading.Event()
    if victims is not None and job.every:
        args = (job.every, job.seed, stop, kills, victims)
        threading.Thread(target=chaos, args=args, daemon=True).start()
    if settle is not None:
        env["HORA_ELASTIC_SETTLE_SECONDS"] = settle
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    command = [sys.executable, __file__, "--child", json.dumps(dataclasses.asdict(job)), str(out)]
    with keep.open("w") as err:
        child = subprocess.Popen(command, stdout=err, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        try:
            child.wait(job.limit + 120)
        except subprocess.TimeoutExpired:  # hora's own timeout did not end it: end it all
            for p in [*psutil.Process(child.pid).children(recursive=True), child]:
                with contextlib.suppress(psutil.Error, OSError):
                    p.kill()
            child.wait()
        finally:
            stop.set()
    text = keep.read_text()
    if not out.exists():
        tail = "\n".join(text.splitlines()[-30:])
        raise SystemExit(f"the run with T={job.every:g} failed ({child.returncode}):\n{tail}")
    record = json.loads(out.read_text()) | lines(text)
    return record | ({"kills": len(kills)} if victims is not None else {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", default="0,15,5", help="seconds between kills; 0: none")
    parser.add_argument("--seconds", type=float, default=60, help="the failure-free run's length")
    parser.add_argument("--quick", action="store_true", help="~25 s runs (--seconds 25)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace", action="store_true", help="the ranks log every step")
    parser.add_argument("--settle", help="HORA_ELASTIC_SETTLE_SECONDS (default: the engine's)")
    parser.add_argument("--engine", choices=["local", "spark", "ray"], default="local")
    parser.add_argument("--kill", choices=["rank", "host"], default="rank", help="on the cluster")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        one_run(Job(**json.loads(args.child[0])), args.child[1])
        return
    seconds = 25 if args.quick else args.seconds
    every = [float(t) for t in args.every.split(",")]
    every = [0.0, *(t for t in every if t)]  # the failure-free run first: the ratio's base
    folder = tempfile.mkdtemp(prefix="hora-bench-chaos-")
    steps = round(seconds / args.epochs / STEP_GUESS)
    base = Job(folder, steps * NP * Job.batch, args.epochs, seed=args.seed, trace=args.trace)
    base = dataclasses.replace(base, limit=LIMIT * seconds + 60, engine=args.engine)
    write_data(folder, base.samples)
    os.chmod(folder, 0o755)  # the cluster's ranks read it (mkdtemp makes it the owner's alone)
    print(
        f"{args.engine}: np={NP} min_np={MIN_NP} max_np={NP}, "
        f"{base.samples} samples x {base.epochs} epochs, "
        f"batch {base.batch}/rank, commit every {base.commit_every} steps, "
        f"HORA_ELASTIC_SETTLE_SECONDS={args.settle or 'unset (the engine default)'}, "
        f"kills: {'a rank' if args.engine == 'local' else 'a ' + args.kill + ' at a time'}, "
        f"a run stops after {base.limit:.0f} s; "
        f"output of each run in {folder}",
        flush=True,
    )
    with contextlib.ExitStack() as stack:
        victims = None
        if args.engine != "local":
            started = stack.enter_context(_chaos_cluster.cluster(args.engine))
            base = dataclasses.replace(base, cluster=_chaos_cluster.address(started))
            victims = functools.partial(_chaos_cluster.victims, started, args.kill)
        rows = []
        for t in every:
            job = dataclasses.replace(base, every=t)
            row = measure(job, Path(folder, f"output-{t:g}.txt"), args.settle, victims)
            rows.append((t, row))
            print(f"T={t:g} s: {json.dumps(row)}", flush=True)
    report(base, rows)


def report(base: Job, rows: list[tuple[float, dict[str, Any]]]) -> None:
    """The table: each T against the failure-free run (the first row)."""
    print(f"\ngoals: {GOALS}\n")
    print(
        f"{'T (s)':>5}  {'wall (s)':>8}  {'samples/s':>9}  {'steps/s':>7}  {'goodput':>7}  "
        f"{'kills':>5}  {'shrunk in place':>15}  {'grown in place':>14}  "
        f"{'full restarts (failed, to grow)':>31}  trained"
    )
    work = base.samples * base.epochs
    base_rate = work / rows[0][1]["wall"] if "error" not in rows[0][1] else float("nan")
    for t, r in rows:
        restarts = f"{r['restarts']} ({r['failed']}, {r['grown_by_restart']})"
        if "error" in r:
            rate, steps, goodput = "-", "-", "-"
            trained = f"did not finish: {r['error']}"
        else:
            rate = f"{work / r['wall']:.0f}"
            steps = f"{r['steps'] / r['wall']:.1f}"
            goodput = f"{work / r['wall'] / base_rate:.0%}"
            wrong = ", ".join(
                f"{n} ids {c}x" for c, n in r["counts"].items() if c != f"{base.epochs}"
            )
            trained = "exact" if not r["wrong"] else f"{r['wrong']} ids wrong ({wrong})"
            trained += "" if r["agree"] else "; the ranks' models differ"
        print(
            f"{t or 'none':>5}  {r['wall']:8.1f}  {rate:>9}  {steps:>7}  {goodput:>7}  "
            f"{r['kills']:5}  {r['shrunk']:>6} of {r['shrinking']:<6}  "
            f"{r['grown']:>5} of {r['growing']:<6}  {restarts:>31}  {trained}"
        )
    verdict(rows)


def verdict(rows: list[tuple[float, dict[str, Any]]]) -> None:
    """Each goal, met or not, over the runs with failures."""
    chaotic = [(t, r) for t, r in rows if t]
    done = [(t, r) for t, r in rows if "error" not in r]
    wrong = [f"T={t:g}" for t, r in done if r["wrong"] or not r["agree"]]
    unfinished = ", ".join(f"T={t:g}" for t, r in rows if "error" in r)
    restarted = [f"T={t:g}: {r['restarts']}" for t, r in chaotic if r["restarts"]]
    once = f"not met ({', '.join(wrong)})" if wrong else "met"
    print(f"\nexactly once per epoch: {once}" + (f"; unknown: {unfinished}" if unfinished else ""))
    print(f"zero full restarts: {'not met (' + ', '.join(restarted) + ')' if restarted else 'met'}")
    at15 = [r for t, r in rows if t == 15]
    if at15 and rows[0][0] == 0 and "error" not in rows[0][1]:
        share = rows[0][1]["wall"] / at15[0]["wall"] if "error" not in at15[0] else 0.0
        print(f"goodput at T=15 s: {share:.0%}, {'met' if share >= 0.9 else 'not met'} (>= 90%)")


if __name__ == "__main__":
    main()
