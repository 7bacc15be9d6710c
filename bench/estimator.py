"""TorchEstimator against what a Spark user would write instead, in the same run:

1. feed: the rows per second one rank's training loop receives from hora's feed (its Parquet
   shard read with pyarrow, a seeded shuffle, batches from a background thread), against
   reading the same shard straight into tensors with pyarrow and slicing it (the limit), and
   against `df.toPandas()` + a torch DataLoader (what many notebooks do). Read + one epoch.
2. inference: `TorchModel.transform` rows/s against pyspark's `predict_batch_udf`, same model,
   same batch size, same cached DataFrame (both forced with a `noop` write).
3. end to end: `TorchEstimator.fit` of a digits MLP against a hand-written `hora.Runner` loop
   over `toPandas()` data (same model, optimizer, batch size, epochs, 2 ranks).

    .venv/bin/python bench/estimator.py [--rows 200000] [--rounds 3]

Rounds alternate the contenders; medians and ratios are printed. Everything binds to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

WIDTH = 64
BATCH = 256


def spark_session():
    from pyspark.sql import SparkSession

    return (
        SparkSession.Builder()
        .master("local[2]")
        .appName("hora-bench-estimator")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", "ERROR")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )


def synthetic(spark, rows: int):
    """`features` array<float>[64] and a `label` 0..9, made in the JVM and cached."""
    from pyspark.sql import functions as F

    features = F.array(*[F.rand(seed=i).cast("float") for i in range(WIDTH)])
    df = (
        spark.range(rows)
        .select(features.alias("features"), (F.col("id") % 10).alias("label"))
        .cache()
    )
    df.count()
    return df


def mlp():
    from torch import nn

    return nn.Sequential(nn.Linear(WIDTH, 128), nn.ReLU(), nn.Linear(128, 10))


def timed(fn: Callable[[], int]) -> float:
    """Rows per second of `fn`, which returns the rows it delivered."""
    start = time.perf_counter()
    rows = fn()
    return rows / (time.perf_counter() - start)


def alternate(
    contenders: dict[str, Callable[[], float]], rounds: int, warm_up: bool = False
) -> dict[str, float]:
    """Medians of `rounds` alternating rounds (after one untimed round with `warm_up`)."""
    if warm_up:
        for fn in contenders.values():
            fn()
    figures: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            figures[name].append(fn())
    for name, values in figures.items():
        print(f"  {name}: " + ", ".join(f"{v:,.0f}" for v in values))
    return {name: statistics.median(values) for name, values in figures.items()}


def bench_feed(spark, df, rounds: int) -> dict[str, float]:
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    from hora.spark.estimator import feed
    from hora.spark.estimator.columns import describe
    from hora.spark.estimator.store import Store

    store = Store.parse(tempfile.mkdtemp(prefix="hora-bench-store-"))
    specs, _ = feed.sample(df, describe(df, ["features"], "f"), describe(df, ["label"], "l"), None)
    data = feed.prepare(df, store, specs, 1, None, seed=0)
    size, rank = 2, 0

    def hora_feed() -> int:
        arrays = feed.read_shard(store, data.train_path, specs, rank, size)
        batches = feed.Batches(arrays, data.train_rows // size, BATCH, torch.device("cpu"))
        rows = 0
        for x, y in batches.epoch(feed.epoch_seed(0, 0, rank)):
            rows += len(y)
            x.sum()  # touch it, as a training step would
        return rows

    def pyarrow_straight() -> int:
        files = feed._parquet_files(store.filesystem(), data.train_path)
        total = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        stop = total // size  # rank 0's rows, read whole files as a reader that knows them would
        table = pq.read_table(files)
        x = torch.from_numpy(
            table.column("c0").combine_chunks().flatten().to_numpy().reshape(-1, WIDTH)[:stop]
        )
        y = torch.from_numpy(table.column("c1").to_numpy()[:stop])
        rows = 0
        for begin in range(0, stop, BATCH):
            rows += len(y[begin : begin + BATCH])
            x[begin : begin + BATCH].sum()  # touch it, as a training step would
        return rows

    def topandas_dataloader() -> int:
        from torch.utils.data import DataLoader, TensorDataset

        frame = df.toPandas()
        half = len(frame) // size
        x = torch.from_numpy(np.stack(frame["features"].to_numpy()[:half]).astype(np.float32))
        y = torch.from_numpy(frame["label"].to_numpy()[:half])
        rows = 0
        for _xb, yb in DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True):
            rows += len(yb)
        return rows

    return alternate(
        {
            "hora feed (read + 1 epoch)": lambda: timed(hora_feed),
            "pyarrow straight to tensors": lambda: timed(pyarrow_straight),
            "toPandas + DataLoader": lambda: timed(topandas_dataloader),
        },
        rounds,
    )


def bench_inference(spark, df, rounds: int) -> dict[str, float]:
    import torch
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql import types as T

    from hora.spark import TorchModel

    torch.manual_seed(0)
    module = mlp().eval()
    model = TorchModel(
        model=module,
        feature_cols=["features"],
        label_cols=["label"],
        input_shapes=[[WIDTH]],
        batch_size=BATCH,
    )
    rows = df.count()

    def make_predict_fn():
        net = module

        def predict(x):
            with torch.inference_mode():
                return net(torch.from_numpy(x)).numpy()

        return predict

    udf = predict_batch_udf(
        make_predict_fn,
        return_type=T.ArrayType(T.FloatType()),
        batch_size=BATCH,
        input_tensor_shapes=[[WIDTH]],
    )

    def hora_transform() -> int:
        model.transform(df).write.format("noop").mode("overwrite").save()
        return rows

    def spark_udf() -> int:
        df.withColumn("label__output", udf("features")).write.format("noop").mode(
            "overwrite"
        ).save()
        return rows

    return alternate(
        {
            "TorchModel.transform": lambda: timed(hora_transform),
            "predict_batch_udf": lambda: timed(spark_udf),
        },
        rounds,
        warm_up=True,  # Python workers started and torch imported in them, for both
    )


def runner_train(x, y, epochs: int, batch: int, lr: float):
    """The hand-written alternative: one rank's loop over its slice of toPandas() data."""
    import torch
    from torch import nn

    import hora.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = x[hvd.rank() :: hvd.size()], y[hvd.rank() :: hvd.size()]
    steps = len(y) // batch + (len(y) % batch > 0)
    for epoch in range(epochs):
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(epoch))
        for step in range(steps):
            idx = order[step * batch : (step + 1) * batch]
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    rank = hvd.rank()
    hvd.shutdown()
    return model.state_dict() if rank == 0 else None


def bench_fit(spark, rounds: int, epochs: int) -> dict[str, float]:
    import numpy as np
    import pandas as pd
    import torch
    from sklearn.datasets import load_digits
    from torch import nn

    import hora
    from hora.spark import TorchEstimator

    digits = load_digits()
    frame = pd.DataFrame({"features": list(digits.data / 16.0), "label": digits.target})
    df = spark.createDataFrame(frame).cache()
    rows = df.count()
    store = tempfile.mkdtemp(prefix="hora-bench-fit-")
    counter = iter(range(1000))

    def estimator() -> int:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
        TorchEstimator(
            model=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
            loss=nn.functional.cross_entropy,
            feature_cols=["features"],
            label_cols=["label"],
            batch_size=32,
            epochs=epochs,
            num_proc=2,
            store=store,
            run_id=f"bench-{next(counter)}",
            verbose=0,
        ).fit(df)
        return rows * epochs

    def runner() -> int:
        local = df.toPandas()
        x = torch.tensor(np.stack(local["features"].to_numpy()), dtype=torch.float32)
        y = torch.tensor(local["label"].to_numpy())
        hora.Runner(np=2, driver_log_verbosity="log_callback_only").run(
            runner_train, x=x, y=y, epochs=epochs, batch=32, lr=0.05
        )
        return rows * epochs

    return alternate(
        {
            "TorchEstimator.fit": lambda: timed(estimator),
            "toPandas + hora.Runner loop": lambda: timed(runner),
        },
        rounds,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--only", choices=("feed", "inference", "fit"), default=None)
    args = parser.parse_args(argv)
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark = spark_session()
    try:
        df = synthetic(spark, args.rows) if args.only != "fit" else None
        if args.only in (None, "feed"):
            print(f"1. feed, rank 0 of 2, {args.rows:,} rows x {WIDTH} floats, rows/s:")
            m = bench_feed(spark, df, args.rounds)
            hora_rate = m["hora feed (read + 1 epoch)"]
            print(
                f"   hora / pyarrow straight {hora_rate / m['pyarrow straight to tensors']:.2f}x,"
                f" hora / toPandas+DataLoader {hora_rate / m['toPandas + DataLoader']:.2f}x"
            )
        if args.only in (None, "inference"):
            print(f"2. inference, {args.rows:,} rows, batch {BATCH}, rows/s:")
            m = bench_inference(spark, df, args.rounds)
            ratio = m["TorchModel.transform"] / m["predict_batch_udf"]
            print(f"   TorchModel.transform / predict_batch_udf {ratio:.2f}x")
        if args.only in (None, "fit"):
            print(f"3. end to end, digits (1,797 rows), {args.epochs} epochs, 2 ranks, rows/s:")
            m = bench_fit(spark, args.rounds, args.epochs)
            ratio = m["TorchEstimator.fit"] / m["toPandas + hora.Runner loop"]
            print(f"   TorchEstimator.fit / Runner loop {ratio:.2f}x")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
