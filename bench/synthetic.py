"""Synthetic training benchmark in the shape of Horovod's pytorch_synthetic_benchmark.py.

Random images, a small CNN of our own (torchvision is not a dependency), `hvd.DistributedOptimizer`
with optional fp16 allreduce; prints "Img/sec per worker" and the total like Horovod's script.
In the same run it then times the same loop under torch DDP and prints the ratio.

    .venv/bin/python bench/synthetic.py [--np 2] [--batch-size 32] [--num-iters 5]
        [--num-warmup-batches 3] [--num-batches-per-iter 5] [--fp16-allreduce] [--model smallcnn]
"""

from __future__ import annotations

import argparse
import os
import statistics
import timeit
from typing import Any

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import hora


def make_model(name: str) -> Any:
    from torch import nn

    width = {"smallcnn": 32, "widecnn": 64}[name]
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(2 * width, 2 * width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(2 * width, 100),
    )  # fmt: skip


def _measure(step: Any, args: argparse.Namespace, log: Any, label: str) -> list[float]:
    log(f"Running warmup ({label})...")
    timeit.timeit(step, number=args.num_warmup_batches)
    log(f"Running benchmark ({label})...")
    img_secs = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(step, number=args.num_batches_per_iter)
        img_secs.append(args.batch_size * args.num_batches_per_iter / seconds)
        log(f"Iter #{i}: {img_secs[-1]:.1f} img/sec per CPU")
    return img_secs


def worker(args: argparse.Namespace) -> dict[str, list[float]]:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import hora.torch as hvd

    hvd.init()
    torch.manual_seed(0)

    def log(message: str) -> None:
        if hvd.rank() == 0:
            print(message, flush=True)

    data = torch.randn(args.batch_size, 3, 32, 32)
    target = torch.randint(0, 100, (args.batch_size,))
    model = make_model(args.model)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()),
        named_parameters=model.named_parameters(),
        compression=compression,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def benchmark_step(model: Any = model, optimizer: Any = optimizer) -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of CPUs: {hvd.size()}")
    results = {"hvd": _measure(benchmark_step, args, log, "hora")}
    mean = statistics.mean(results["hvd"])
    conf = 1.96 * statistics.pstdev(results["hvd"])
    log(f"Img/sec per CPU: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {hvd.size()} CPU(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")

    ddp = torch.nn.parallel.DistributedDataParallel(make_model(args.model))
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.01 * hvd.size())
    if args.fp16_allreduce:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(dist.group.WORLD, default_hooks.fp16_compress_hook)
    results["ddp"] = _measure(
        lambda: benchmark_step(ddp, ddp_opt), args, log, "torch DDP, same loop"
    )
    hvd.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2, help="number of local processes")
    parser.add_argument("--fp16-allreduce", action="store_true", help="fp16 compression")
    parser.add_argument("--model", default="smallcnn", choices=["smallcnn", "widecnn"])
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size per worker")
    parser.add_argument("--num-warmup-batches", type=int, default=3)
    parser.add_argument("--num-batches-per-iter", type=int, default=5)
    parser.add_argument("--num-iters", type=int, default=5)
    args = parser.parse_args()
    results = hora.run(worker, (args,), np=args.np)[0]
    hvd_mean, ddp_mean = (statistics.mean(results[k]) for k in ("hvd", "ddp"))
    print(f"hora Img/sec per worker: {hvd_mean:.1f}, total on {args.np}: {args.np * hvd_mean:.1f}")
    print(f"DDP  Img/sec per worker: {ddp_mean:.1f}, total on {args.np}: {args.np * ddp_mean:.1f}")
    print(f"hora / DDP: {hvd_mean / ddp_mean:.2f}x")


if __name__ == "__main__":
    main()
