"""Training steps per second: hvd.DistributedOptimizer vs torch DDP vs one process.

On 2 ranks, in the same job and alternating rounds, the same model is trained with
`hvd.DistributedOptimizer` and with `torch.nn.parallel.DistributedDataParallel` (default
buckets), and without any exchange (each rank alone: "no-comm", the ceiling); a 1-rank job then
trains it alone with the plain optimizer, same per-rank batch.
Models: (a) an MLP of 50 small Linear layers (many small gradients: fusion matters) and (b) a
small CNN. Scaling efficiency = samples/s on 2 ranks / (2 x samples/s on 1 process); the
physical limit on a 2-core machine is 1.0 (2.0x).

hora's allreduce goes through shared memory here (one host); `--no-shm` keeps it on gloo, as DDP.

    .venv/bin/python bench/train_step.py [--steps 30] [--rounds 5] [--batch-size 32] [--no-shm]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import hora


def make_model(kind: str) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    if kind == "mlp50":
        layers: list[nn.Module] = [nn.Linear(32, 64), nn.ReLU()]
        for _ in range(48):
            layers += [nn.Linear(64, 64), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(64, 10))
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 10),
    )  # fmt: skip


def make_batch(kind: str, batch_size: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(1)
    shape = (batch_size, 32) if kind == "mlp50" else (batch_size, 3, 32, 32)
    return torch.randn(*shape, generator=g), torch.randint(0, 10, (batch_size,), generator=g)


def _steps_per_s(model: Any, opt: Any, batch: tuple[Any, Any], steps: int) -> float:
    import torch.nn.functional as F

    x, y = batch
    start = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return steps / (time.perf_counter() - start)


def distributed(kind: str, steps: int, rounds: int, batch_size: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import hora.torch as hvd

    hvd.init()
    batch = make_batch(kind, batch_size)
    hvd_model, ddp_base = make_model(kind), make_model(kind)
    hvd_opt = hvd.DistributedOptimizer(
        torch.optim.SGD(hvd_model.parameters(), lr=0.01, momentum=0.9),
        named_parameters=hvd_model.named_parameters(),
    )
    ddp = torch.nn.parallel.DistributedDataParallel(ddp_base)
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    alone = make_model(kind)  # each rank on its own, nothing exchanged: the ceiling on 2 ranks
    alone_opt = torch.optim.SGD(alone.parameters(), lr=0.01, momentum=0.9)
    sides = {"hvd": (hvd_model, hvd_opt), "ddp": (ddp, ddp_opt), "no-comm": (alone, alone_opt)}
    for model, opt in sides.values():
        _steps_per_s(model, opt, batch, 3)  # warm-up
    rates: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(rounds):
        for key in list(sides) if r % 2 == 0 else list(reversed(sides)):
            dist.barrier()
            rates[key].append(_steps_per_s(*sides[key], batch, steps))
    threads = torch.get_num_threads()
    hvd.shutdown()
    return {"rates": rates, "threads": threads}


def single(kind: str, steps: int, rounds: int, batch_size: int) -> dict[str, Any]:
    import torch

    model = make_model(kind)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batch = make_batch(kind, batch_size)
    _steps_per_s(model, opt, batch, 3)
    rates = [_steps_per_s(model, opt, batch, steps) for _ in range(rounds)]
    return {"rates": {"single": rates}, "threads": torch.get_num_threads()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--models", nargs="+", default=["mlp50", "cnn"])
    parser.add_argument(
        "--no-shm",
        action="store_true",
        help="HORA_SHM=0: hora's allreduce on gloo too, as between hosts (like for like)",
    )
    args = parser.parse_args()
    work = (args.steps, args.rounds, args.batch_size)
    env = {"HORA_SHM": "0"} if args.no_shm else {}
    print(
        f"{'model':>6} {'hvd steps/s':>12} {'ddp steps/s':>12} {'hvd/ddp':>8} "
        f"{'no-comm steps/s':>16} {'1-proc steps/s':>15} {'scaling hvd':>12} {'scaling ddp':>12}"
    )
    for kind in args.models:
        two = hora.run(distributed, (kind, *work), np=2, env=env)[0]
        one = hora.run(single, (kind, *work), np=1)[0]
        med = {k: statistics.median(v) for k, v in {**two["rates"], **one["rates"]}.items()}
        print(
            f"{kind:>6} {med['hvd']:>12.1f} {med['ddp']:>12.1f} {med['hvd'] / med['ddp']:>7.2f}x "
            f"{med['no-comm']:>16.1f} {med['single']:>15.1f} "
            f"{2 * med['hvd'] / med['single']:>11.2f}x {2 * med['ddp'] / med['single']:>11.2f}x"
        )
        print(f"       (threads per process: {two['threads']} on 2 ranks, {one['threads']} alone)")


if __name__ == "__main__":
    main()
