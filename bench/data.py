"""hora.data against Mosaic Streaming (and Petastorm where it imports): one DataFrame, one launcher.

One DataFrame (`--rows` rows: an id, `--features` float features as one array column, a label),
written once as Parquet by Spark before any clock starts and read back as `df` (and the same
rows written once as a Delta table with `deltalake`). For each contender the clock starts on the
driver at `df` (or the table):

- hora: `hora.data.from_spark(df)` (a plain Parquet scan: read in place, nothing written), then
  in each rank `dataset.loader(batch_size)`, shuffled;
- hora-order: the same, in file order (the shuffle's cost: hora against hora-order);
- hora-delta: `hora.data.from_delta(table)`, then the same loader;
- Mosaic Streaming: `dataframe_to_mds(df, mds_kwargs={"out": ..., "columns": ...})`, then in
  each rank `StreamingDataset(local=out, shuffle=True)` + `StreamingDataLoader`;
- Petastorm (only where `petastorm.spark` imports: pyarrow < 15, see bench/README.md):
  `make_spark_converter(df)`, then `make_torch_dataloader(cur_shard=rank, shard_count=size,
  num_epochs=1)`.

Each is launched by the same `hora.run(np=2, backend="local")`; each rank reads one epoch into a
loop that does nothing and reports when its first batch came, when its epoch ended, its rows and
its peak RSS. Printed per contender: conversion, df -> every rank in the training function (the
launch), df -> first batch in every rank, end to end (conversion + one epoch), steady rows/s per
rank (after the first batch), peak RSS per rank; then the ratios against hora, the conversion's
share of hora's end to end, and the shuffle's cost. Caches are new each run (no reuse).

    .venv/bin/python bench/data.py                  # 100,000 rows x 256 features (~100 MB)
    .venv/bin/python bench/data.py --full           # 4,000,000 rows x 300 features (~4.8 GB)
    <petastorm venv>/bin/python bench/data.py --contenders hora,petastorm   # see bench/README.md
    .venv/bin/python bench/data.py --plan-files 10000 --latency-ms 5   # many files' footers

Everything binds to 127.0.0.1; `streaming` gets the torchvision stand-in of tests/data/_stubs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STUBS = REPO / "tests" / "data" / "_stubs"
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# Mosaic Streaming imports torchvision, whose PyPI wheels do not load against the CPU torch:
# the stand-in goes first for this process, Spark's Python workers and the ranks.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(STUBS), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
)
sys.path[:0] = [str(STUBS), str(REPO)]

NP = 2


def spark_session(memory: str):
    from pyspark.sql import SparkSession

    return (
        SparkSession.Builder()
        .master(f"local[{NP}]")
        .appName("hora-bench-data")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", "ERROR")
        .config("spark.driver.memory", memory)
        .getOrCreate()
    )


def source_frame(spark, rows: int, features: int, folder: str):
    """The DataFrame every contender converts: written once as Parquet, read back."""
    from pyspark.sql import functions as F

    values = F.array(*[F.rand(seed=i).cast("float") for i in range(features)])
    df = spark.range(rows).select(
        "id",
        # nullable elements: Mosaic's converter maps only ArrayType(FloatType(), True)
        values.cast("array<float>").alias("features"),
        (F.col("id") % 10).alias("label"),
    )
    df.repartition(2 * NP).write.mode("overwrite").parquet(folder)
    return spark.read.parquet(folder)


# ----- the conversions, on the driver -----------------------------------------------------------


def convert_hora(df, folder: str, features: int):
    import hora.data

    return hora.data.from_spark(df, cache=False, store=folder)


def convert_delta(df, folder: str, features: int):
    import hora.data

    return hora.data.from_delta(DELTA[0])


def convert_mosaic(df, folder: str, features: int):
    from streaming.base.converters import dataframe_to_mds

    out = os.path.join(folder, "mds")
    columns = {"id": "int64", "features": f"ndarray:float32:{features}", "label": "int64"}
    dataframe_to_mds(df, merge_index=True, mds_kwargs={"out": out, "columns": columns})
    return out


def convert_petastorm(df, folder: str, features: int):
    from petastorm.spark import SparkDatasetConverter, make_spark_converter

    df.sparkSession.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, f"file://{folder}")
    return make_spark_converter(df)


CONVERT = {
    "hora": convert_hora,
    "hora-order": convert_hora,
    "hora-delta": convert_delta,
    "mosaic": convert_mosaic,
    "petastorm": convert_petastorm,
}
DELTA: list[str] = []  # the Delta table of the source rows, written before any clock starts


def delta_table(source: str, folder: str) -> str:
    """The source Parquet's rows as a Delta table, written by delta-rs (no Spark), in a child
    process: read into this one, they would stay in the peak RSS the ranks inherit by fork."""
    import subprocess

    code = (
        "import sys, pyarrow.dataset as ds; from deltalake import write_deltalake; "
        "write_deltalake(sys.argv[2], ds.dataset(sys.argv[1], format='parquet').to_table())"
    )
    subprocess.run([sys.executable, "-c", code, source, folder], check=True)
    return folder


# ----- in each rank --------------------------------------------------------------------------


def batches(kind: str, handle, batch: int, workers: int):
    """This rank's batches of one shuffled epoch, from each contender's own reader."""
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if kind.startswith("hora"):
        yield from handle.loader(batch_size=batch, shuffle=kind != "hora-order", seed=0)
    elif kind == "mosaic":
        from streaming import StreamingDataLoader, StreamingDataset

        dataset = StreamingDataset(local=handle, shuffle=True, shuffle_seed=0, batch_size=batch)
        yield from StreamingDataLoader(dataset, batch_size=batch, num_workers=workers)
    else:
        # a seed: without one each shard shuffles the row groups its own way before sharding,
        # and rows are read twice or not at all
        with handle.make_torch_dataloader(
            batch_size=batch, num_epochs=1, cur_shard=rank, shard_count=size, seed=0
        ) as loader:
            yield from loader


def one_epoch(kind: str, handle, batch: int, workers: int) -> dict:
    """Read one epoch into a loop that does nothing; when, how many rows, how much memory."""
    import resource

    start = time.time()
    first = None
    rows = first_rows = 0
    for b in batches(kind, handle, batch, workers):
        n = len(b["label"])
        if first is None:
            first, first_rows = time.time(), n
        rows += n
    end = time.time()
    first = end if first is None else first  # a rank given no rows
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"start": start, "first": first, "end": end, "rows": rows, "first_rows": first_rows,
            "rss": peak}  # fmt: skip


# ----- the driver ------------------------------------------------------------------------------


def one_run(kind: str, df, rows: int, features: int, batch: int, workers: int, root: str) -> dict:
    import hora

    folder = tempfile.mkdtemp(prefix=f"{kind}-", dir=root)
    if kind == "mosaic":
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
    t0 = time.time()
    handle = CONVERT[kind](df, folder, features)
    converted = time.time() - t0
    ranks = hora.run(one_epoch, (kind, handle, batch, workers), np=NP, backend="local")
    total = sum(r["rows"] for r in ranks)
    if total != rows:
        print(f"  note: {kind} gave {total} rows for {rows} (padding or drops)")
    shutil.rmtree(folder, ignore_errors=True)
    return {
        "convert": converted,
        "started": max(r["start"] for r in ranks) - t0,  # every rank in the training function
        "first": max(r["first"] for r in ranks) - t0,
        "end_to_end": max(r["end"] for r in ranks) - t0,
        "steady": statistics.mean(
            (r["rows"] - r["first_rows"]) / max(r["end"] - r["first"], 1e-9) for r in ranks
        ),
        "rss": max(r["rss"] for r in ranks),
    }


def plan_many_files(count: int, latency_ms: float) -> None:
    """`count` small Parquet files (10 rows each): the time to plan them (`from_parquet`'s
    footers, a loader, the first epoch's order and units), its footers read one by one and in
    parallel; and the footers alone through a filesystem that waits `latency_ms` per call."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    import hora.data
    from hora.data import _footers
    from tests.data._parquet import slow_files

    folder = Path(tempfile.mkdtemp(prefix="hora-bench-files-"))
    try:
        for i in range(count):
            ids = np.arange(i * 10, i * 10 + 10)
            table = pa.table({"id": ids, "x": np.ones(10, np.float32)})
            pq.write_table(table, folder / f"part-{i:05d}.parquet")
        print(f"{count:,} Parquet files of 10 rows; load {os.getloadavg()[0]:.1f}")
        default = _footers.FOOTER_THREADS
        for _ in range(2):  # a local disk's footers are read one by one (faster there)
            start = time.perf_counter()
            dataset = hora.data.from_parquet(folder)
            footers = time.perf_counter() - start
            loader = dataset.loader(64, rank=0, size=1)
            loader._start()  # the epoch's order, windows and shares
            planned = time.perf_counter() - start
            print(f"  local disk: footers {footers:.2f} s; planned (footers, a loader, the "
                  f"epoch's order) {planned:.2f} s")  # fmt: skip
        slow = slow_files(latency_ms / 1e3)
        paths = [str(folder / f"part-{i:05d}.parquet") for i in range(count)]
        timing = {}
        for threads in (1, default):
            _footers.FOOTER_THREADS = threads
            start = time.perf_counter()
            found = _footers.read_footers(slow, paths)
            timing[threads] = time.perf_counter() - start
            assert all(isinstance(f, _footers.Footer) for f in found)
            print(f"  {latency_ms:g} ms a call: footers with {threads:2d} threads "
                  f"{timing[threads]:.2f} s")  # fmt: skip
        print(f"  parallel / one by one at {latency_ms:g} ms: {timing[1] / timing[default]:.1f}x")
        _footers.FOOTER_THREADS = default
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--full", action="store_true", help="4,000,000 rows x 300 features")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--mosaic-workers", type=int, default=0, help="StreamingDataLoader's")
    parser.add_argument("--contenders", default="hora,hora-order,hora-delta,mosaic")
    parser.add_argument("--memory", default="3g", help="the Spark driver's memory")
    parser.add_argument("--plan-files", type=int, help="only: plan this many small files")
    parser.add_argument("--latency-ms", type=float, default=5.0, help="with --plan-files")
    args = parser.parse_args()
    if args.plan_files:
        plan_many_files(args.plan_files, args.latency_ms)
        return
    if args.full:
        args.rows, args.features = 4_000_000, 300
    kinds = args.contenders.split(",")
    root = tempfile.mkdtemp(prefix="hora-bench-data-")
    try:
        spark = spark_session(args.memory)
        t = time.time()
        df = source_frame(spark, args.rows, args.features, os.path.join(root, "source"))
        if "hora-delta" in kinds:
            DELTA.append(delta_table(os.path.join(root, "source"), os.path.join(root, "delta")))
        written = time.time() - t
        print(
            f"{args.rows:,} rows x {args.features} features, batch {args.batch}, {NP} ranks; "
            f"source written in {written:.1f} s; load {os.getloadavg()[0]:.1f}"
        )
        found: dict[str, list[dict]] = {k: [] for k in kinds}
        for round_ in range(args.rounds):
            for kind in kinds if round_ % 2 == 0 else kinds[::-1]:
                result = one_run(
                    kind, df, args.rows, args.features, args.batch, args.mosaic_workers, root
                )
                found[kind].append(result)
                print(f"  round {round_} {kind:10s} " + describe(result), flush=True)
        report(found, kinds)
        spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def describe(r: dict) -> str:
    return (
        f"convert {r['convert']:.1f} s, every rank started {r['started']:.1f} s, "
        f"first batch in every rank {r['first']:.1f} s, "
        f"end to end {r['end_to_end']:.1f} s, steady {r['steady']:,.0f} rows/s per rank, "
        f"peak RSS {r['rss'] / 2**20:,.0f} MiB per rank"
    )


def report(found: dict[str, list[dict]], kinds: list[str]) -> None:
    median = {
        k: {m: statistics.median(r[m] for r in runs) for m in runs[0]} for k, runs in found.items()
    }
    print("medians:")
    for kind in kinds:
        print(f"  {kind:10s} " + describe(median[kind]))
    ours = [k for k in kinds if k.startswith("hora") and k != "hora-order"]
    for mine in ours:
        hora = median[mine]
        share = hora["convert"] / hora["end_to_end"]
        print(f"{mine}: conversion {share:.1%} of the end to end (goal <= 5%)")
        for kind in kinds:
            if kind.startswith("hora"):
                continue
            other = median[kind]
            print(
                f"{mine} vs {kind}: end to end {other['end_to_end'] / hora['end_to_end']:.2f}x "
                f"(goal >= 5x), first batch {other['first'] / hora['first']:.2f}x, "
                f"steady rows/s {hora['steady'] / other['steady']:.2f}x (goal >= 1x), "
                f"peak RSS {mine} / {kind} {hora['rss'] / other['rss']:.2f}"
            )
    if "hora" in median and "hora-order" in median:
        cost = median["hora"]["steady"] / median["hora-order"]["steady"]
        print(f"shuffled / file-order steady rows/s: {cost:.2f} (goal >= 0.8)")


if __name__ == "__main__":
    main()
