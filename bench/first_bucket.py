"""DistributedOptimizer's first bucket on CPU: 8 MiB (hora's default) against DDP's 1 MiB, and DDP.

A bucket sent during backward overlaps with it, but on CPU the negotiation round and the engine
thread's Python it costs run on the cores that compute backward. On 2 ranks, in one job and
alternating rounds, the same model trains with hora's first bucket, with DDP's 1 MiB one (the
rest of the buckets alike), and under DDP. Models (bench/train_step.py's): the small CNN (its two
last layers hold 1.05 MB: one bucket with hora's default, two with 1 MiB), the same CNN with a
wider first fully connected layer (`cnn256`, `cnn512`: 2 and 4 MiB) and `wide`, an MLP of seven
1024-wide layers (26 MB: two buckets either way, the first larger with hora's default).

    .venv/bin/python bench/first_bucket.py [--rounds 10] [--steps 30] [--load 2]
        [--models cnn cnn256 cnn512 wide]
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

from train_step import _steps_per_s, busy_load, make_batch, make_model, make_optimizer

import hora


def compare(kind: str, steps: int, rounds: int, batch_size: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import hora.torch as hvd
    import hora.torch._buckets as hvd_buckets

    hvd.init()
    sides: dict[str, tuple[Any, Any]] = {}
    buckets: dict[str, list[int]] = {}
    default_cap = hvd_buckets._CPU_FIRST_BUCKET_CAP_BYTES
    for key, cap in (("hora", default_cap), ("1 MiB", hvd_buckets._FIRST_BUCKET_CAP_BYTES)):
        hvd_buckets._CPU_FIRST_BUCKET_CAP_BYTES = cap  # read when the buckets are cut
        model = make_model(kind)
        opt = hvd.DistributedOptimizer(
            make_optimizer(kind, model.parameters()), named_parameters=model.named_parameters()
        )
        sides[key] = (model, opt)
        buckets[key] = [sum(p.numel() * p.element_size() for p in b) for b in opt._buckets]
    hvd_buckets._CPU_FIRST_BUCKET_CAP_BYTES = default_cap
    ddp = torch.nn.parallel.DistributedDataParallel(make_model(kind))
    sides["ddp"] = (ddp, make_optimizer(kind, ddp.parameters()))
    batch = make_batch(kind, batch_size)
    rates: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(rounds + 1):  # round 0 warms up
        for key in list(sides) if r % 2 == 0 else list(reversed(sides)):
            dist.barrier()
            rate = _steps_per_s(*sides[key], batch, steps)
            if r:
                rates[key].append(rate)
    hvd.shutdown()
    return {"rates": rates, "buckets": buckets}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per side and round")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--models", nargs="+", default=["cnn", "wide"])
    parser.add_argument("--load", type=int, default=0, help="busy-looping processes beside")
    args = parser.parse_args()
    print(f"load {args.load}, {args.rounds} rounds of {args.steps} steps per side")
    with busy_load(args.load):
        for kind in args.models:
            out = hora.run(compare, (kind, args.steps, args.rounds, args.batch_size), np=2)[0]
            rates = out["rates"]
            med = {k: statistics.median(v) for k, v in rates.items()}
            sizes = {
                k: " + ".join(f"{b / 2**20:.2f}" for b in v) for k, v in out["buckets"].items()
            }
            print(
                f"{kind:>5}: hora's first bucket ({sizes['hora']} MiB) {med['hora']:.1f} steps/s, "
                f"DDP's 1 MiB ({sizes['1 MiB']} MiB) {med['1 MiB']:.1f}, DDP {med['ddp']:.1f}; "
                f"hora/1 MiB {med['hora'] / med['1 MiB']:.2f}x, "
                f"hora/DDP {med['hora'] / med['ddp']:.2f}x, "
                f"1 MiB/DDP {med['1 MiB'] / med['ddp']:.2f}x"
            )
            per_round = [a / b for a, b in zip(rates["hora"], rates["1 MiB"], strict=True)]
            print(
                f"       hora/1 MiB per round: median {statistics.median(per_round):.2f}x, "
                f"{min(per_round):.2f}-{max(per_round):.2f}x"
            )


if __name__ == "__main__":
    main()
