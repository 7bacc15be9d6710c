"""The demo: a small CNN learns scikit-learn's real handwritten digits on 2 ranks.

`python examples/digits.py` (or `make demo`) trains through `hora.Runner(np=-2)` with Horovod's
API (`import hora.torch as hvd`), following the HorovodRunner migration steps: `hvd.init()`, pin
the device by local rank, shard the data by rank, scale the learning rate by the number of ranks,
wrap the optimizer in `hvd.DistributedOptimizer`, broadcast the initial weights and optimizer
state from rank 0, and write checkpoints on rank 0 only. Rank 0 reports the held-out accuracy and
the driver gets it back as the run's return value.

When pyspark and Java are installed, the same `train` then runs on an embedded local Spark
(`local[2]`, loopback only) through `hora.Runner(np=2)`: a barrier stage of 2 tasks, each starting
one rank, exactly as on a cluster. `--spark no` skips that step, `--spark yes` requires it.
"""

from __future__ import annotations

import argparse
import os
import sys

import hora


def train(
    epochs: int = 40, lr: float = 0.02, batch_size: int = 32, checkpoint_dir: str | None = None
) -> float:
    """One rank's training; returns the held-out accuracy (the same on every rank)."""
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch import nn

    import hora.torch as hvd

    hvd.init()  # 1. initialise Horovod
    device = torch.device("cpu")
    if torch.cuda.is_available():  # 2. one GPU per process, chosen by local rank
        gpu = hvd.local_rank() % torch.cuda.device_count()  # ranks share when GPUs are fewer
        torch.cuda.set_device(gpu)
        device = torch.device("cuda", gpu)

    digits = load_digits()  # 1,797 real 8x8 digits shipped with scikit-learn: nothing to download
    x = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)  # (N, 1, 8, 8)
    y = torch.tensor(digits.target)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0)
    x_train = x_train[hvd.rank() :: hvd.size()].to(device)  # 3. this rank's shard of the data
    y_train = y_train[hvd.rank() :: hvd.size()].to(device)

    torch.manual_seed(hvd.rank())  # different on purpose: the broadcast below makes them equal
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
    ).to(device)  # fmt: skip
    # 4. scale the learning rate by the number of ranks (the global batch grows with it)
    opt = torch.optim.SGD(model.parameters(), lr=lr * hvd.size(), momentum=0.9)
    # 5. average gradients across ranks during backward
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    # 6. every rank starts from rank 0's weights and optimizer state
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    gen = torch.Generator().manual_seed(hvd.rank())
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(x_train), generator=gen)
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            opt.zero_grad()
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            loss.backward()
            opt.step()
        # 7. checkpoints by rank 0 only, so workers do not overwrite each other
        if checkpoint_dir and hvd.rank() == 0 and (epoch + 1) % 10 == 0:
            path = os.path.join(checkpoint_dir, f"checkpoint-{epoch + 1}.pt")
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
        if hvd.rank() == 0 and (epoch + 1) % 10 == 0:
            print(f"epoch {epoch + 1}/{epochs}: loss {loss.item():.4f}", flush=True)
    model.eval()
    with torch.no_grad():
        predictions = model(x_test.to(device)).argmax(1).cpu()
    accuracy = (predictions == y_test).float().mean().item()
    if hvd.rank() == 0:
        print(f"held-out accuracy: {accuracy:.4f}", flush=True)
    hvd.shutdown()
    return accuracy


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--np", type=int, default=2, help="number of local processes")
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--checkpoint-dir", default=None, help="rank 0 saves checkpoints here")
    parser.add_argument(
        "--spark",
        choices=("auto", "yes", "no"),
        default="auto",
        help="then run again on an embedded local[NP] Spark, as NP barrier tasks "
        "(auto: when pyspark and Java are installed)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    accuracy = hora.Runner(np=-args.np).run(
        train, epochs=args.epochs, checkpoint_dir=args.checkpoint_dir
    )
    print(f"driver: rank 0 returned held-out accuracy {accuracy:.4f}")
    if args.spark == "yes" or (args.spark == "auto" and _spark_available()):
        accuracy = min(accuracy, run_on_local_spark(args.np, args.epochs))
    return accuracy


def _spark_available() -> bool:
    import importlib.util
    import shutil

    has_java = shutil.which("java") or os.environ.get("JAVA_HOME")
    return importlib.util.find_spec("pyspark") is not None and bool(has_java)


def run_on_local_spark(np: int, epochs: int) -> float:
    """The same `train` on Spark: `Runner(np=N)` with N > 0 is a barrier stage of N tasks.

    The SparkSession is embedded (`local[N]`, loopback only); on a cluster, use the active one.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    print(f"\nstarting an embedded Spark (local[{np}]) and running the same training on it")
    spark = (
        SparkSession.Builder()
        .master(f"local[{np}]")
        .appName("hora-digits")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", "ERROR")
        .getOrCreate()
    )
    try:
        accuracy = hora.Runner(np=np).run(train, epochs=epochs)
    finally:
        spark.stop()
    print(f"driver: on Spark, rank 0 returned held-out accuracy {accuracy:.4f}")
    return accuracy


if __name__ == "__main__":
    sys.exit(0 if main() >= 0.95 else 1)
