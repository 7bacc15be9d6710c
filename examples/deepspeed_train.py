"""A DeepSpeed training script, written for the `deepspeed` launcher, unchanged under hora.

    deepspeed --num_gpus 2 examples/deepspeed_train.py --deepspeed_config ds.json    (DeepSpeed)
    hora run -np 2 examples/deepspeed_train.py --deepspeed --deepspeed_config ds.json
    DeepspeedTorchDistributor(numGpus=2, useGpu=False, deepspeedConfig={...}).run(path)

It reads `--local_rank` (the `deepspeed` launcher passes it) or LOCAL_RANK (torchrun, hora),
calls `deepspeed.init_distributed()` with no arguments, and lets `deepspeed.initialize` build the
engine from the config: with `zero_optimization.stage` 1, 2 or 3 each rank keeps only its shard
of the optimizer state, gradients and (stage 3) parameters. Real data: scikit-learn's digits.
`--losses FILE`: rank 0 writes the loss curve there as JSON.
"""

from __future__ import annotations

import argparse
import json
import os

import deepspeed
import torch
import torch.nn.functional as F
from torch import nn


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local_rank", "--local-rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--losses", default=None)
    parser = deepspeed.add_config_arguments(parser)  # --deepspeed, --deepspeed_config
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    local_rank = args.local_rank if args.local_rank >= 0 else int(os.environ["LOCAL_RANK"])
    deepspeed.init_distributed()  # reads RANK, WORLD_SIZE, MASTER_ADDR/PORT from the launcher
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    engine, _, _, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters()
    )
    rank, world = engine.global_rank, engine.world_size

    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target)
    micro = engine.train_micro_batch_size_per_gpu()
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))
    curve: list[float] = []
    for step in range(args.steps):
        first = (step * micro * world) % (len(x) - micro * world) + rank * micro
        batch = order[first : first + micro]
        loss = F.cross_entropy(engine(x[batch].to(engine.device)), y[batch].to(engine.device))
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        torch.distributed.all_reduce(mean)
        curve.append(mean.item() / world)
    if rank == 0:
        stage = engine.zero_optimization_stage()
        print(f"deepspeed ZeRO-{stage} on {world} ranks (local rank {local_rank} here): "
              f"loss {curve[0]:.4f} -> {curve[-1]:.4f}")  # fmt: skip
        if args.losses:
            with open(args.losses, "w") as f:
                json.dump(curve, f)


if __name__ == "__main__":
    main()
