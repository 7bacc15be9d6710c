"""The demo: a small network learns scikit-learn's real handwritten digits on 2 ranks.

`python examples/digits.py` (or `make demo`) trains through `hora.Runner(np=-2)`: each rank
trains on its half of the training set with DistributedDataParallel over gloo, rank 0 reports
the held-out accuracy, and the driver gets it back as the run's return value.
"""

from __future__ import annotations

import argparse
import os
import sys

import hora


def train(epochs: int = 40, lr: float = 0.05, batch_size: int = 32) -> float:
    """One rank's training; returns the held-out accuracy (the same on every rank)."""
    import torch
    import torch.distributed as dist
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    digits = load_digits()  # 1,797 real 8x8 digits shipped with scikit-learn: nothing to download
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0)
    x_train, y_train = x_train[rank::size], y_train[rank::size]  # this rank's shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr * size, momentum=0.9)
    gen = torch.Generator().manual_seed(rank)
    for epoch in range(epochs):
        order = torch.randperm(len(x_train), generator=gen)
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(x_train[idx]), y_train[idx])
            loss.backward()
            opt.step()
        if rank == 0 and (epoch + 1) % 10 == 0:
            print(f"epoch {epoch + 1}/{epochs}: loss {loss.item():.4f}", flush=True)
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    if rank == 0:
        print(f"held-out accuracy: {accuracy:.4f}", flush=True)
    dist.destroy_process_group()
    return accuracy


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--np", type=int, default=2, help="number of local processes")
    parser.add_argument("--epochs", type=int, default=40)
    args = parser.parse_args(argv)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    accuracy = hora.Runner(np=-args.np).run(train, epochs=args.epochs)
    print(f"driver: rank 0 returned held-out accuracy {accuracy:.4f}")
    return accuracy


if __name__ == "__main__":
    sys.exit(0 if main() > 0.9 else 1)
