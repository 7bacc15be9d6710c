"""The DeepSpeed script bench/sharded.py launches through both doors: a small model, 20 steps;
rank 0 writes the wall-clock time at the end of every step to OUT/steps.json."""

from __future__ import annotations

import argparse
import json
import os
import time

import deepspeed
import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    deepspeed.init_distributed()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    engine, _, _, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters()
    )
    x = torch.randn(8, 256)
    y = torch.randint(0, 10, (8,))
    times = []
    for _ in range(args.steps):
        loss = nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        times.append(time.time())
    if engine.global_rank == 0:
        with open(os.path.join(args.out, "steps.json"), "w") as f:
            json.dump(times, f)


if __name__ == "__main__":
    main()
