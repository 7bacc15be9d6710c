"""Pipeline parallelism: the model's layers split in two stages, one per rank.

A torchrun script, unchanged under hora: `hora run -np 2 examples/pipeline_parallel.py`. Rank 0
holds the first half of the network, rank 1 the second half and the loss: neither ever holds the
whole model. Each batch is cut into micro-batches that flow through the stages GPipe-style
(`torch.distributed.pipelining`), so both ranks work at once on different micro-batches; only
the activations at the cut (and their gradients) travel between the ranks.

`--losses FILE`: the last rank (where the loss is computed) writes the loss curve there as JSON.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--losses", default=None)
    return parser.parse_args()


def stages() -> list[nn.Module]:
    """The whole model, cut in two; every rank builds it from one seed and keeps its part."""
    torch.manual_seed(0)
    first = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
    second = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    return [first, second]


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 2:
        raise SystemExit(f"this example has 2 stages: run it on 2 ranks, not {world}")
    device = torch.device("cpu")
    module = stages()[rank]
    stage = PipelineStage(module, stage_index=rank, num_stages=world, device=device)
    schedule = ScheduleGPipe(stage, n_microbatches=args.microbatches, loss_fn=F.cross_entropy)
    opt = torch.optim.Adam(module.parameters(), lr=args.lr)

    from sklearn.datasets import load_digits

    data = load_digits()  # both ranks read the data: rank 0 the inputs, rank 1 the labels
    x = torch.tensor(data.data / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))
    curve: list[float] = []
    for step in range(args.steps):
        first = (step * args.batch_size) % (len(x) - args.batch_size)
        batch = order[first : first + args.batch_size]
        opt.zero_grad()
        if rank == 0:
            schedule.step(x[batch])
        else:
            losses: list[torch.Tensor] = []
            schedule.step(target=y[batch], losses=losses)
            curve.append(torch.stack(losses).mean().item())
        opt.step()
    if rank == world - 1:
        print(f"pipeline: loss {curve[0]:.4f} -> {curve[-1]:.4f} (rank {rank}, last stage)")
        if args.losses:
            with open(args.losses, "w") as f:
                json.dump(curve, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()
