"""What to check on the driver before a barrier stage is submitted, so it never waits forever.

Spark queues a barrier stage that asks for more slots than the cluster has (retrying for minutes),
refuses one under dynamic allocation, and pyspark's TorchDistributor refuses to run unencrypted
training traffic on a cluster that asked for TLS. Each check says what to change.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from hora.engines.spark.options import HORA_IGNORE_SSL, TORCH_IGNORE_SSL

if TYPE_CHECKING:
    from hora.engines.spark.base import Session

# How often the slots of a cluster whose executors are still registering are counted again.
SLOT_POLL_SECONDS = 0.2
# Which Python the tasks start: "auto" (the driver's where it exists on every executor, that is
# on a local or local-cluster master; Spark's own elsewhere), "driver" or "spark".
PYTHON_KEY = "spark.hora.executorPython"
PYTHON_CHOICES = ("auto", "driver", "spark")


def _true(session: Session, key: str) -> bool:
    return session.conf(key, "false").strip().lower() == "true"


def is_local_master(session: Session) -> bool:
    master = session.master
    return master == "local" or master.startswith("local[")


def runs_on_this_machine(master: str) -> bool:
    """local, local[N], local[N,F], local-cluster[...]: every executor sees the driver's files."""
    return master == "local" or master.startswith(("local[", "local-cluster["))


def python_for_tasks(session: Session) -> str | None:
    """The interpreter that the tasks' Python workers start with: the driver's own, or None for
    Spark's choice (PYSPARK_PYTHON when the SparkSession started, else `python3` on the PATH).

    The driver's pickles need the driver's versions; on one machine its interpreter is at hand.
    A Spark Connect client has no say: its server's environment decides.
    """
    choice = session.conf(PYTHON_KEY, "auto").strip().lower()
    if choice not in PYTHON_CHOICES:
        raise ValueError(
            f"{PYTHON_KEY}={choice!r} is not one of {', '.join(PYTHON_CHOICES)}: 'driver' starts "
            "the tasks with the driver's interpreter, 'spark' with PYSPARK_PYTHON, 'auto' picks "
            "'driver' on a local or local-cluster master and 'spark' elsewhere"
        )
    if session.kind == "connect":
        if choice == "driver":
            raise ValueError(
                f"{PYTHON_KEY}=driver cannot be honoured from a Spark Connect client: the Connect "
                "server starts the tasks with the Python of PYSPARK_PYTHON in its own "
                f"environment. Start the server with it set, and remove {PYTHON_KEY}."
            )
        return None
    if choice == "spark" or (choice == "auto" and not runs_on_this_machine(session.master)):
        return None
    return sys.executable or None


def check_ssl(session: Session, ignore_key: str = TORCH_IGNORE_SSL) -> None:
    """Refuse to train in the clear on a cluster with `spark.ssl.enabled`, unless opted in with
    hora's setting or `ignore_key` (the door's original's: pyspark's TorchDistributor's, its
    DeepSpeed door's, spark-tensorflow-distributor's)."""
    if not _true(session, "spark.ssl.enabled"):
        return
    if _true(session, HORA_IGNORE_SSL) or _true(session, ignore_key):
        return
    raise RuntimeError(
        "This Spark cluster has TLS encryption enabled (spark.ssl.enabled=true), but hora does "
        "not support data encryption in transit: its training traffic is not encrypted (the "
        "driver channel is authenticated (HMAC) but sent in the clear, and torch.distributed "
        "exchanges tensors unencrypted). To run anyway, set "
        f"'{HORA_IGNORE_SSL}' (or '{ignore_key}') to 'true' in the Spark configuration; model "
        "parameters and possibly data will then cross the network unencrypted."
    )


def check_dynamic_allocation(session: Session) -> None:
    """Barrier stages need all executors at once: Spark refuses them under dynamic allocation."""
    if is_local_master(session) or not _true(session, "spark.dynamicAllocation.enabled"):
        return
    raise ValueError(
        "spark.dynamicAllocation.enabled=true, and Spark does not run barrier stages (which hora "
        "uses so that all ranks start together) under dynamic allocation. Start the "
        "SparkSession with spark.dynamicAllocation.enabled=false and a fixed number of "
        "executors (spark.executor.instances), or run on this machine instead (Runner(np=-N), "
        "TorchDistributor(local_mode=True))."
    )


def gpu_amount_key(resource: str = "gpu") -> str:
    return f"spark.task.resource.{resource}.amount"


def task_gpu_amount(session: Session, resource: str = "gpu") -> float:
    try:
        return float(session.conf(gpu_amount_key(resource), "0"))
    except ValueError:
        return 0.0


def resolve_use_gpu(session: Session, use_gpu: bool | None, resource: str = "gpu") -> bool:
    """`None` means: pin GPUs when tasks are given GPUs. `True` without GPU tasks is an error."""
    amount = task_gpu_amount(session, resource)
    if use_gpu and amount <= 0:
        raise ValueError(
            f"use_gpu=True but '{gpu_amount_key(resource)}' is not set, so Spark gives tasks no "
            "GPUs. Set it (for example to 1) with the executors' GPU resources, or pass "
            "use_gpu=False."
        )
    return amount > 0 if use_gpu is None else bool(use_gpu)


def concurrent_slots(session: Session, resource: str = "gpu") -> int | None:
    """How many tasks of the default resource profile the cluster can run at once right now, or
    None where that cannot be known (some Spark Connect clusters).

    Spark's own count (cores and custom resources such as GPUs), the one it checks barrier
    stages against; on a Spark Connect session, the count its settings give.
    """
    slots = session.slots()
    gpus_per_task = task_gpu_amount(session, resource)
    if slots is not None and is_local_master(session) and gpus_per_task > 0:
        # Local mode counts cores only; its tasks can only get the driver's own GPUs.
        driver_gpus = len(session.driver_gpus(resource) or [])
        slots = min(slots, int(driver_gpus // gpus_per_task))
    return slots


def check_slots(
    session: Session,
    np: int,
    wait: float,
    resource: str = "gpu",
    say: Callable[[str], None] | None = None,
) -> int | None:
    """Return the slot count once `np` tasks can run together, or raise ValueError.

    Where the count can grow (a classic cluster's executors still registering after a fresh
    SparkSession, a lost executor being replaced, a cluster that scales up on demand), wait up
    to `wait` seconds (the run's start_timeout), saying what it waits for and each change of
    the count; refuse at once where it cannot (a local master; a Connect cluster's count, which
    its settings give). Spark's own barrier check would queue the stage and retry it for
    minutes, unsaid. None: the slots cannot be counted (see `uncounted_slots`).
    """
    slots = concurrent_slots(session, resource)
    if slots is None:
        return None
    grows = session.kind == "classic" and not is_local_master(session)
    deadline = time.monotonic() + wait
    said = None
    while slots < np and grows and time.monotonic() < deadline:
        if slots != said:
            _say(say, waiting_for_slots(session, np, slots, wait, resource))
            said = slots
        time.sleep(SLOT_POLL_SECONDS)
        slots = concurrent_slots(session, resource) or 0
    if slots >= np:
        if said is not None:
            _say(say, f"hora: the cluster can run {slots} tasks at once now; np={np} starts")
        return slots
    waited = f" after waiting {wait:g} s (start_timeout) for more executors" if grows else ""
    raise ValueError(
        f"np={np} needs {np} Spark task slots at once, but "
        f"{describe_slots(session, slots, resource)}{waited}"
    )


def waiting_for_slots(session: Session, np: int, slots: int, wait: float, resource: str) -> str:
    """What a launch that waits for executors says: how many slots it has, how many it needs."""
    executors = session.executors()
    registered = "" if executors is None else f" ({executors} executors registered)"
    return (
        f"hora: np={np} needs {np} Spark task slots at once; the cluster can run {slots} now"
        f"{registered}: waiting up to start_timeout={wait:g} s for more executors to register"
    )


def _say(say: Callable[[str], None] | None, text: str) -> None:
    if say is not None:
        say(text)
    else:
        print(text, file=sys.stderr, flush=True)


def uncounted_slots(np: int, start_timeout: float) -> str:
    """What a run on a cluster whose slots cannot be counted is told once, before it starts."""
    return (
        f"hora: cannot count this Spark Connect cluster's task slots (its master and settings "
        f"do not say how many executors and cores it has); if it has fewer than np={np} free, "
        f"the ranks will not start and the run ends after start_timeout={start_timeout:g} s"
    )


def describe_slots(session: Session, slots: int, resource: str = "gpu") -> str:
    cpus = session.conf("spark.task.cpus", "1")
    gpus = task_gpu_amount(session, resource)
    amount_key = gpu_amount_key(resource)
    gpu_note = f", {amount_key}={gpus:g}" if gpus > 0 else ""
    master = session.master
    if is_local_master(session):
        if gpus > 0:
            have = len(session.driver_gpus(resource) or [])
            return (
                f"this SparkSession (master {master}{gpu_note}) has {slots}: local mode runs "
                f"tasks on the driver, which has {have} GPU(s) for tasks that each ask for "
                f"{gpus:g}. "
                + _remedy(
                    slots,
                    f"give the driver GPUs (spark.driver.resource.{resource}.amount and its "
                    f"discoveryScript), or unset {amount_key}.",
                )
            )
        return (
            f"this SparkSession (master {master}, spark.task.cpus={cpus}) has {slots}. "
            + _remedy(
                slots,
                "give Spark more local cores (for example master 'local[N]'), or lower "
                "spark.task.cpus.",
            )
        )
    executors = session.executors()
    registered = "?" if executors is None else executors
    cores = session.conf("spark.executor.cores", "?")
    return (
        f"this cluster can run {slots} ({registered} executors registered, spark.executor.cores="
        f"{cores}, spark.task.cpus={cpus}{gpu_note}). "
        + _remedy(
            slots,
            "give the cluster more executors or cores (spark.executor.instances, "
            "spark.executor.cores), or lower spark.task.cpus"
            f"{' or the GPUs per task' if gpu_note else ''}.",
        )
    )


def _remedy(slots: int, change: str) -> str:
    if slots > 0:
        return f"Lower np to {slots} or less, or {change}"
    return change[0].upper() + change[1:]
