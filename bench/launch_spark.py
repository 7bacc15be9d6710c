"""Spark launch overhead: a tiny 2-rank gloo job on one warm `local[2]` SparkSession.

Times, alternating in one run, `hora.Runner(np=2)` (the Spark engine) and pyspark's
`TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)` (a barrier stage running
torchrun in each task); prints medians and the ratio (target: hora >= 4x faster).

    .venv/bin/python bench/launch_spark.py [--reps 7] [--only hora|torch-distributor]
    .venv/bin/python bench/launch_spark.py --connect [URL]

`--connect` runs both on a Spark Connect session instead: `SparkSession.builder.remote(URL)`,
by default `local[2]` (pyspark starts the Connect server in this process); for a separate server,
`sc://host:port` (its executors must run this Python: its PYSPARK_PYTHON is the server's).

Also called by `bench/launch.py --spark`. Everything binds to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

EXPECTED = [3.0] * 4
HORA = "hora Runner(np=2)"
TORCH_DISTRIBUTOR = "TorchDistributor(local_mode=False)"


def allreduce_job() -> list[float]:
    """The work both launchers run: import torch, init gloo from the env, one allreduce."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.tolist()


def ship_jobs_by_value() -> None:
    """Workers cannot import this file as a module (when bench/launch.py imports it): ship
    allreduce_job by value, with hora's cloudpickle and with pyspark's bundled copy."""
    import cloudpickle
    from pyspark import cloudpickle as spark_cloudpickle

    for pickler in (cloudpickle, spark_cloudpickle):
        pickler.register_pickle_by_value(sys.modules[__name__])


def spark_session(master: str = "local[2]"):
    """A loopback-only SparkSession with its UI and progress bar off."""
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(master)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", "ERROR")
        .getOrCreate()
    )


def connect_session(url: str):
    """A Spark Connect session; for `local[N]` its in-process server gets the settings of
    `spark_session` (static: pyspark warns that the client cannot change them, and applies
    them to the server it starts)."""
    import warnings

    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote(url)
    if url.startswith("local"):
        builder = builder.config("spark.ui.showConsoleProgress", "false")
        builder = builder.config("spark.log.level", "ERROR")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return builder.getOrCreate()


def run_hora() -> list[float]:
    import hora

    return hora.Runner(np=2).run(allreduce_job)


def run_torch_distributor() -> list[float]:
    from pyspark.ml.torch.distributor import TorchDistributor

    return TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(allreduce_job)


def time_it(fn: Callable[[], list[float]]) -> float:
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    assert result == EXPECTED, result
    return elapsed


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--only", choices=("hora", "torch-distributor"), default=None)
    parser.add_argument(
        "--connect",
        nargs="?",
        const="local[2]",
        default=None,
        metavar="URL",
        help="on a Spark Connect session to URL (default local[2]: a server in this process)",
    )
    args = parser.parse_args(argv)

    ship_jobs_by_value()
    contenders: dict[str, Callable[[], list[float]]] = {}
    if args.only in (None, "hora"):
        contenders[HORA] = run_hora
    if args.only in (None, "torch-distributor"):
        contenders[TORCH_DISTRIBUTOR] = run_torch_distributor

    started = time.perf_counter()
    spark = connect_session(args.connect) if args.connect else spark_session()
    session_s = time.perf_counter() - started
    where = f"Spark Connect {args.connect}" if args.connect else "local[2]"
    import torch  # noqa: F401  (both drivers have torch imported before the clock starts)

    try:
        for fn in contenders.values():  # warm-up: Spark's first job, Python workers, imports
            time_it(fn)
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(args.reps):
            for name, fn in contenders.items():
                times[name].append(time_it(fn))
    finally:
        spark.stop()

    medians = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"\nSparkSession {where} start: {session_s:.1f} s (not counted below)")
    print(f"2-rank gloo allreduce on warm {where}, call to result, median of {args.reps} (s)")
    for name, median in medians.items():
        spread = f"{min(times[name]):.2f}-{max(times[name]):.2f}"
        print(f"  {name:36s} {median:6.2f} s  (range {spread})")
    if len(medians) == 2:
        ratio = medians[TORCH_DISTRIBUTOR] / medians[HORA]
        print(f"TorchDistributor(local_mode=False) / hora Runner(np=2) = {ratio:.2f} (target >= 4)")
    return medians


if __name__ == "__main__":
    main()
