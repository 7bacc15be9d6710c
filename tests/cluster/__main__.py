"""Bring a test cluster of namespaced hosts up and down by hand (as root).

    python -m tests.cluster up --hosts 2 [--cores 2] [--no-ray] [--shape 1gbit,0.2ms]
    python -m tests.cluster status
    python -m tests.cluster down

`up` starts a background process that owns the cluster, waits until Spark and Ray are ready,
prints the Spark master URL and the Ray address, and returns; `down` stops every cluster that
`up` started (and removes what a crashed one left behind). A driver joins from this machine's
root namespace: `SparkSession.builder.master(URL).config("spark.driver.host", DRIVER)
.config("spark.driver.bindAddress", DRIVER)`, or `ray.init(address=ADDRESS)`.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.cluster._cluster import Cluster
from tests.cluster._hosts import SLOTS, STATE_ROOT, Shape, Slot, clean_slot, why_unavailable

UP_SECONDS = 300.0
DOWN_SECONDS = 60.0
RECORD = "cluster.json"  # in the slot's folder: what `status` shows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.cluster", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "serve"):
        sub = commands.add_parser(
            name, help="start a cluster" if name == "up" else argparse.SUPPRESS
        )
        sub.add_argument("--hosts", type=int, default=2)
        sub.add_argument("--cores", type=int, default=2, help="Spark cores and Ray CPUs per host")
        sub.add_argument("--no-spark", action="store_true")
        sub.add_argument("--no-ray", action="store_true")
        sub.add_argument(
            "--shape", help="every link: RATE[,DELAY[,JITTER]][,LOSS%%], e.g. 1gbit,0.2ms"
        )
        if name == "serve":
            sub.add_argument("--ready", required=True)
    commands.add_parser("down", help="stop every cluster `up` started")
    commands.add_parser("status", help="list the clusters on this machine")
    args = parser.parse_args(argv)
    if args.command in ("up", "serve", "down") and (reason := why_unavailable()):
        print(f"cannot make a test cluster here: {reason}", file=sys.stderr)
        return 2
    return {"up": up, "serve": serve, "down": down, "status": status}[args.command](args)


def up(args: argparse.Namespace) -> int:
    if args.shape:
        Shape.parse(args.shape)  # a bad shape fails here, not in the background
    STATE_ROOT.mkdir(parents=True, exist_ok=True)
    ready = STATE_ROOT / f"up-{os.getpid()}.json"
    log = STATE_ROOT / f"up-{os.getpid()}.log"
    argv = [sys.executable, "-m", "tests.cluster", "serve", "--ready", str(ready)]
    argv += _options(args)
    with open(log, "wb") as out:
        owner = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=Path(__file__).resolve().parents[2],  # the checkout: `tests` imports from there
        )
    deadline = time.monotonic() + UP_SECONDS
    while not ready.exists():
        if owner.poll() is not None or time.monotonic() > deadline:
            print(
                f"the cluster did not come up; {log}:\n{log.read_text()[-4000:]}", file=sys.stderr
            )
            return 1
        time.sleep(0.2)
    record = json.loads(ready.read_text())
    ready.unlink()
    log.unlink()
    _print(record)
    return 0


def _options(args: argparse.Namespace) -> list[str]:
    out = ["--hosts", str(args.hosts), "--cores", str(args.cores)]
    out += ["--no-spark"] * args.no_spark + ["--no-ray"] * args.no_ray
    return out + (["--shape", args.shape] if args.shape else [])


def serve(args: argparse.Namespace) -> int:
    """The background owner: start, say where everything is, wait for SIGTERM, stop."""
    cluster = Cluster(args.hosts, args.cores, spark=not args.no_spark, ray=not args.no_ray)
    with cluster:
        if args.shape:
            cluster.shape(Shape.parse(args.shape))
        assert cluster.network is not None
        record = {
            "pid": os.getpid(),
            "slot": cluster.network.prefix,
            "driver": cluster.driver_address,
            "spark_master": cluster.spark_master if cluster.spark else None,
            "ray_address": cluster.ray_address if cluster.ray else None,
            "ray_auth_mode": os.environ.get("RAY_AUTH_MODE", "disabled"),
            "hosts": {
                h.name: {"address": h.address, "enter": " ".join(cluster.network.enter(h))}
                for h in cluster.hosts
            },
            "shape": args.shape,
            "start_seconds": round(cluster.start_seconds, 1),
        }
        (cluster.network.slot.folder / RECORD).write_text(json.dumps(record, indent=1))
        Path(args.ready).write_text(json.dumps(record))
        with contextlib.suppress(KeyboardInterrupt):
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
            while True:
                signal.pause()
    return 0


def down(args: argparse.Namespace) -> int:
    """SIGTERM every `serve` owner, wait for it, then sweep what any dead owner left."""
    for index in range(SLOTS):
        lock_path = STATE_ROOT / f"hc{index}.lock"
        if not lock_path.exists():
            continue
        with open(lock_path, "a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: stop it if `up` started it, leave a test run's alone
                owner = _owner(lock_path)
                if owner is None:
                    print(f"hc{index}: in use by a test run, left alone")
                    continue
                os.kill(owner, signal.SIGTERM)
                if not _wait_for_lock(lock, DOWN_SECONDS):
                    print(
                        f"hc{index}: owner {owner} did not stop in {DOWN_SECONDS:g} s",
                        file=sys.stderr,
                    )
                    return 1
                print(f"hc{index}: stopped (owner {owner})")
            clean_slot(Slot(index, lock))
    return 0


def _owner(lock_path: Path) -> int | None:
    """The pid in the lock file, if that process is a `python -m tests.cluster serve`."""
    with contextlib.suppress(OSError, ValueError):
        pid = int(lock_path.read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"tests.cluster" in cmdline and b"serve" in cmdline:
            return pid
    return None


def _wait_for_lock(lock, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            time.sleep(0.2)
    return False


def status(args: argparse.Namespace) -> int:
    found = False
    for record in sorted(STATE_ROOT.glob(f"hc*/{RECORD}")):
        info = json.loads(record.read_text())
        if Path(f"/proc/{info['pid']}").exists():
            _print(info)
            found = True
    if not found:
        print("no cluster started by `up` is running")
    return 0


def _print(record: dict) -> None:
    print(
        f"cluster {record['slot']} (owner pid {record['pid']}, up in {record['start_seconds']} s)"
    )
    print(f"  driver address: {record['driver']}  (spark.driver.host / bindAddress)")
    if record["spark_master"]:
        print(f"  Spark master:   {record['spark_master']}")
    if record["ray_address"]:
        mode = record["ray_auth_mode"]
        print(f"  Ray address:    {record['ray_address']}  (RAY_AUTH_MODE={mode})")
    for name, host in record["hosts"].items():
        print(f"  {name}: {host['address']}  (a shell there: {host['enter']} bash)")
    if record.get("shape"):
        print(f"  links shaped:   {record['shape']}")


if __name__ == "__main__":
    sys.exit(main())
