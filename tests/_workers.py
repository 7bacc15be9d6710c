"""Tiny worker functions the launcher tests run for real in several processes."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

CONTRACT = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK",
    "HOROVOD_CROSS_SIZE",
    "LOCAL_SIZE",
    "CROSS_RANK",
    "CROSS_SIZE",
    "OMP_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "USER_VAR",
)


def rank_times(x: int) -> int:
    return int(os.environ["RANK"]) * x


def env_contract() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in CONTRACT}


def gloo_allreduce() -> float:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")  # no arguments: the launcher's environment is enough
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()


def fail_on(rank: int, how: str) -> None:
    """Rank `rank` fails in the way named; the others wait forever (they must be stopped)."""
    if int(os.environ["RANK"]) == rank:
        print(f"rank {rank} about to fail", flush=True)
        if how == "raise":
            raise ValueError("deliberate failure")
        if how == "exit":
            os._exit(3)
        if how == "sys.exit":
            sys.exit(4)
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(3600)


def killed_while_peer_in_collective() -> None:
    """Rank 1 dies by SIGKILL while rank 0 waits for it inside a gloo collective."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1))


def hang() -> None:
    time.sleep(3600)


def ignore_sigterm_and_hang() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(3600)


def spawn_grandchild_and_hang() -> None:
    """Starts a grandchild that would outlive a careless launcher."""
    import subprocess

    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    time.sleep(3600)


def chatter(lines: int) -> str:
    rank = os.environ["RANK"]
    for i in range(lines):
        print(f"out {rank} {i}")
        print(f"err {rank} {i}", file=sys.stderr)
    sys.stdout.write(f"last words of {rank} without newline")  # must not be lost at exit
    return "done"


def progress_bars(steps: int) -> None:
    """A tqdm bar on stderr, and a hand-made one on stdout (`print(..., end="\\r")`)."""
    from tqdm import tqdm

    rank = os.environ["RANK"]
    for _ in tqdm(range(steps), desc=f"bar {rank}", file=sys.stderr, mininterval=0, ascii=True):
        time.sleep(0.01)
    for step in range(steps):
        print(f"step {rank}.{step}", end="\r", flush=True)
        time.sleep(0.1)
    print(f"done {rank}", flush=True)


def log_and_print() -> None:
    from hora import log_to_driver

    print("plain print that log_callback_only hides")
    log_to_driver(f"callback message from {os.environ['RANK']}")


def return_unpicklable() -> object:
    return threading.Lock()


def print_then_wait_for(marker: str) -> str:
    """Prints a line, then waits for the driver's reader to create `marker` (proves liveness)."""
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while not Path(marker).exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the driver never saw the line live")
        time.sleep(0.05)
    return "seen"


def exit_zero() -> None:
    sys.exit(0)


def register_atexit(folder: str) -> None:
    """The worker ends without interpreter teardown: its atexit handlers must still run."""
    import atexit

    path = Path(folder) / f"atexit-{os.environ['RANK']}"
    atexit.register(path.write_text, "ran")


def import_from_driver_path() -> str:
    import driver_only_module  # type: ignore[import-not-found]

    return driver_only_module.VALUE


def one_rank_waits_for_data(path: str | None = None) -> int:
    """Rank 1 is stuck in its own code, never reaching the allreduce rank 0 is blocked in.

    With `path`, rank 1 waits until that file exists instead of for ever, then joins in.
    """
    import torch

    import hora.torch as hvd

    hvd.init()
    print(f"ready {hvd.rank()}", flush=True)
    if hvd.rank() == 1:
        wait_for_data(path)
    hvd.allreduce(torch.ones(2), name="grad.w")
    print(f"done {hvd.rank()}", flush=True)
    return hvd.rank()


def wait_for_data(path: str | None) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not (path and os.path.exists(path)):
        time.sleep(0.05)


def report_steps(steps: int = 3) -> int:
    """Every rank reports `loss` = rank + step; rank 0 alone reports `lr` (a number) and `phase`."""
    import hora

    rank = int(os.environ["RANK"])
    for step in range(1, steps + 1):
        values: dict[str, object] = {"loss": float(rank + step)}
        if rank == 0:
            values |= {"lr": 0.1 / step, "phase": "warmup" if step == 1 else "train"}
        hora.report(values)
    return rank


def freeze_rank_1() -> int:
    """Rank 1 stops itself (SIGSTOP), as a process on a host cut off from the network falls
    silent; the other ranks wait for it."""
    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(600)
    return 0
