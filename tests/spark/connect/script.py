"""A training script for the doors that run scripts (TorchDistributor, DeepSpeed, `hora run`):
every rank joins gloo from torchrun's environment, sums its rank, and prints one line."""

import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
print(
    f"script rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} sum {float(total):g} "
    f"argv {' '.join(sys.argv[1:])}",
    flush=True,
)
dist.destroy_process_group()
