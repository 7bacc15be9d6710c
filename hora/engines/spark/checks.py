"""What to check on the driver before a barrier stage is submitted, so it never waits forever.

Spark queues a barrier stage that asks for more slots than the cluster has (retrying for minutes),
refuses one under dynamic allocation, and pyspark's TorchDistributor refuses to run unencrypted
training traffic on a cluster that asked for TLS. Each check says what to change.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from hora.engines.spark.options import HORA_IGNORE_SSL, TORCH_IGNORE_SSL

# A fresh session's executors may still be registering: wait while none is there yet or their
# number grew in the last SLOT_SETTLE_SECONDS, at most SLOT_WAIT_SECONDS. A cluster whose slots
# stay short of np for SLOT_SETTLE_SECONDS is judged as it is.
SLOT_WAIT_SECONDS = 60.0
SLOT_SETTLE_SECONDS = 5.0
# Which Python the tasks start: "auto" (the driver's where it exists on every executor, that is
# on a local or local-cluster master; Spark's own elsewhere), "driver" or "spark".
PYTHON_KEY = "spark.hora.executorPython"
PYTHON_CHOICES = ("auto", "driver", "spark")


def _conf(sc: Any, key: str, default: str = "") -> str:
    return sc.getConf().get(key, default) or default


def _true(sc: Any, key: str) -> bool:
    return _conf(sc, key, "false").strip().lower() == "true"


def is_local_master(sc: Any) -> bool:
    master = sc.master
    return master == "local" or master.startswith("local[")


def runs_on_this_machine(master: str) -> bool:
    """local, local[N], local[N,F], local-cluster[...]: every executor sees the driver's files."""
    return master == "local" or master.startswith(("local[", "local-cluster["))


def python_for_tasks(sc: Any) -> str | None:
    """The interpreter that the tasks' Python workers start with: the driver's own, or None for
    Spark's choice (PYSPARK_PYTHON when the SparkSession started, else `python3` on the PATH).

    The driver's pickles need the driver's versions; on one machine its interpreter is at hand.
    """
    choice = _conf(sc, PYTHON_KEY, "auto").strip().lower()
    if choice not in PYTHON_CHOICES:
        raise ValueError(
            f"{PYTHON_KEY}={choice!r} is not one of {', '.join(PYTHON_CHOICES)}: 'driver' starts "
            "the tasks with the driver's interpreter, 'spark' with PYSPARK_PYTHON, 'auto' picks "
            "'driver' on a local or local-cluster master and 'spark' elsewhere"
        )
    if choice == "spark" or (choice == "auto" and not runs_on_this_machine(sc.master)):
        return None
    return sys.executable or None


def check_ssl(sc: Any, ignore_key: str = TORCH_IGNORE_SSL) -> None:
    """Refuse to train in the clear on a cluster with `spark.ssl.enabled`, unless opted in with
    hora's setting or `ignore_key` (the door's original's: pyspark's TorchDistributor's, its
    DeepSpeed door's, spark-tensorflow-distributor's)."""
    if not _true(sc, "spark.ssl.enabled"):
        return
    if _true(sc, HORA_IGNORE_SSL) or _true(sc, ignore_key):
        return
    raise RuntimeError(
        "This Spark cluster has TLS encryption enabled (spark.ssl.enabled=true), but hora does "
        "not support data encryption in transit: its training traffic is not encrypted (the "
        "driver channel is authenticated (HMAC) but sent in the clear, and torch.distributed "
        "exchanges tensors unencrypted). To run anyway, set "
        f"'{HORA_IGNORE_SSL}' (or '{ignore_key}') to 'true' in the Spark configuration; model "
        "parameters and possibly data will then cross the network unencrypted."
    )


def check_dynamic_allocation(sc: Any) -> None:
    """Barrier stages need all executors at once: Spark refuses them under dynamic allocation."""
    if is_local_master(sc) or not _true(sc, "spark.dynamicAllocation.enabled"):
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


def task_gpu_amount(sc: Any, resource: str = "gpu") -> float:
    try:
        return float(_conf(sc, gpu_amount_key(resource), "0"))
    except ValueError:
        return 0.0


def resolve_use_gpu(sc: Any, use_gpu: bool | None, resource: str = "gpu") -> bool:
    """`None` means: pin GPUs when tasks are given GPUs. `True` without GPU tasks is an error."""
    amount = task_gpu_amount(sc, resource)
    if use_gpu and amount <= 0:
        raise ValueError(
            f"use_gpu=True but '{gpu_amount_key(resource)}' is not set, so Spark gives tasks no "
            "GPUs. Set it (for example to 1) with the executors' GPU resources, or pass "
            "use_gpu=False."
        )
    return amount > 0 if use_gpu is None else bool(use_gpu)


def driver_gpu_addresses(sc: Any, resource: str = "gpu") -> list[str] | None:
    """The driver's GPU resource addresses as Spark discovered them; None if it has none."""
    resources = sc.resources
    return list(resources[resource].addresses) if resource in resources else None


def concurrent_slots(sc: Any, resource: str = "gpu") -> int:
    """How many tasks of the default resource profile the cluster can run at once right now.

    Spark's own count (cores and custom resources such as GPUs), the one it checks barrier
    stages against.
    """
    jsc = sc._jsc.sc()
    profile = jsc.resourceProfileManager().defaultResourceProfile()
    slots = int(jsc.maxNumConcurrentTasks(profile))
    gpus_per_task = task_gpu_amount(sc, resource)
    if is_local_master(sc) and gpus_per_task > 0:
        # Local mode counts cores only; its tasks can only get the driver's own GPUs.
        driver_gpus = len(driver_gpu_addresses(sc, resource) or [])
        slots = min(slots, int(driver_gpus // gpus_per_task))
    return slots


def check_slots(
    sc: Any,
    np: int,
    wait: float = SLOT_WAIT_SECONDS,
    settle: float | None = SLOT_SETTLE_SECONDS,
    resource: str = "gpu",
) -> int:
    """Return the slot count, or raise ValueError if `np` tasks cannot run together.

    Raises as soon as the count has been steady below `np` for `settle` seconds (at once on
    a local master), instead of letting Spark queue the stage and retry it for minutes;
    `settle=None` waits the whole `wait` (a restart, while a lost executor is replaced).
    """
    start = time.monotonic()
    slots = concurrent_slots(sc, resource)
    changed = start
    while slots < np and not is_local_master(sc):
        now = time.monotonic()
        steady = settle is not None and slots > 0 and now - changed > settle
        if now - start > wait or steady:
            break
        time.sleep(0.2)
        latest = concurrent_slots(sc, resource)
        if latest != slots:
            slots, changed = latest, time.monotonic()
    if slots >= np:
        return slots
    raise ValueError(
        f"np={np} needs {np} Spark task slots at once, but {describe_slots(sc, slots, resource)}"
    )


def describe_slots(sc: Any, slots: int, resource: str = "gpu") -> str:
    cpus = _conf(sc, "spark.task.cpus", "1")
    gpus = task_gpu_amount(sc, resource)
    amount_key = gpu_amount_key(resource)
    gpu_note = f", {amount_key}={gpus:g}" if gpus > 0 else ""
    if is_local_master(sc):
        if gpus > 0:
            have = len(driver_gpu_addresses(sc, resource) or [])
            return (
                f"this SparkSession (master {sc.master}{gpu_note}) has {slots}: local mode runs "
                f"tasks on the driver, which has {have} GPU(s) for tasks that each ask for "
                f"{gpus:g}. "
                + _remedy(
                    slots,
                    f"give the driver GPUs (spark.driver.resource.{resource}.amount and its "
                    f"discoveryScript), or unset {amount_key}.",
                )
            )
        return (
            f"this SparkSession (master {sc.master}, spark.task.cpus={cpus}) has {slots}. "
            + _remedy(
                slots,
                "give Spark more local cores (for example master 'local[N]'), or lower "
                "spark.task.cpus.",
            )
        )
    executors = max(0, int(sc._jsc.sc().getExecutorMemoryStatus().size()) - 1)
    cores = _conf(sc, "spark.executor.cores", "?")
    return (
        f"this cluster can run {slots} ({executors} executors registered, spark.executor.cores="
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
