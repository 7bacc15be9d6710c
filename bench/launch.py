"""Launch overhead: wall time from the call to the result of a tiny 2-rank gloo job.

Times, in one run and alternating, hora's `Runner(np=-2)`, a bare `torch.multiprocessing.spawn`
of the same work, and pyspark's `TorchDistributor(num_processes=2, local_mode=True)`; prints the
medians and the ratios. `--spark` adds the Spark engine comparison (bench/launch_spark.py).

    .venv/bin/python bench/launch.py [--reps 7] [--no-torch-distributor] [--spark]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from launch_spark import allreduce_job, ship_jobs_by_value, spark_session

import hora

ship_jobs_by_value()  # every contender ships the job by value, as it would a notebook's function


def _spawned(local_rank: int, port: int, out) -> None:
    os.environ.update(RANK=str(local_rank), WORLD_SIZE="2", MASTER_PORT=str(port))
    result = allreduce_job()
    if local_rank == 0:
        out.put(result)


def run_hora() -> list[float]:
    return hora.Runner(np=-2).run(allreduce_job)


def run_spawn() -> list[float]:
    import torch.multiprocessing as mp

    with socket.socket() as s:  # the baseline's own way to find a port (the race hora avoids)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_spawned, args=(port, out), nprocs=2, join=True)
    return out.get()


def run_torch_distributor() -> list[float]:
    from pyspark.ml.torch.distributor import TorchDistributor

    return TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(allreduce_job)


def time_it(fn) -> float:
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    assert result == [3.0] * 4, result
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--no-torch-distributor", action="store_true")
    parser.add_argument("--spark", action="store_true", help="also run bench/launch_spark.py")
    args = parser.parse_args()

    contenders = {"hora Runner(np=-2)": run_hora, "torch.multiprocessing.spawn": run_spawn}
    if not args.no_torch_distributor:
        spark = spark_session()  # TorchDistributor needs an active session, even in local mode
        contenders["TorchDistributor(local_mode=True)"] = run_torch_distributor
    import torch  # noqa: F401  (every contender's driver has it imported before the clock starts)

    for fn in contenders.values():  # warm-up: first imports, Spark's first job
        time_it(fn)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.reps):
        for name, fn in contenders.items():
            times[name].append(time_it(fn))

    medians = {name: statistics.median(ts) for name, ts in times.items()}
    hora_s = medians["hora Runner(np=-2)"]
    print(f"\n2-rank gloo allreduce job, call to result, median of {args.reps} (seconds)")
    for name, median in medians.items():
        spread = f"{min(times[name]):.2f}-{max(times[name]):.2f}"
        print(f"  {name:36s} {median:6.2f} s  (range {spread})  {median / hora_s:5.2f}x hora")
    print(f"hora / spawn = {hora_s / medians['torch.multiprocessing.spawn']:.2f} (target <= 1.2)")
    if "TorchDistributor(local_mode=True)" in medians:
        ratio = medians["TorchDistributor(local_mode=True)"] / hora_s
        print(f"TorchDistributor / hora = {ratio:.2f} (target >= 3)")
        spark.stop()
    if args.spark:
        import launch_spark

        launch_spark.main(["--reps", str(args.reps)])


if __name__ == "__main__":
    main()
