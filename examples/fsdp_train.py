"""Sharded data parallelism with PyTorch's FSDP2 (`fully_shard`) and sharded checkpoints.

A torchrun script, unchanged under hora: `hora run -np 2 examples/fsdp_train.py`, `torchrun
--nproc-per-node 2 examples/fsdp_train.py`, or `TorchDistributor(2, use_gpu=False).run(path)`.
Each rank keeps only its shard of every parameter, gradient and Adam state (1/N of each); FSDP
gathers a layer's full weights just for its forward and backward. On a GPU machine it uses NCCL,
on CPUs gloo.

`--checkpoint-dir DIR` saves a sharded checkpoint (`torch.distributed.checkpoint`: every rank
writes its own shard, in parallel) every `--save-every` steps, and a restarted run
(`hora run --max-restarts 1 ...`) resumes from the last one, continuing the same loss curve.
`--ddp` trains the same model with DistributedDataParallel instead (for comparison: the losses
agree within float rounding). `--die-at-step N` makes the last rank kill itself at step N on the
first attempt (to try the restart). `--losses FILE`: rank 0 writes the loss curve there as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

LATEST = "latest"  # a file naming the last complete checkpoint; written after every rank saved


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch, split by rank")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--ddp", action="store_true", help="DistributedDataParallel instead")
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--die-at-step", type=int, default=None)
    parser.add_argument("--losses", default=None, help="rank 0 writes the loss curve here")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None)  # deepspeed's
    return parser.parse_args()


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    data = load_digits()  # real 8x8 digits shipped with scikit-learn: nothing to download
    return torch.tensor(data.data / 16.0, dtype=torch.float32), torch.tensor(data.target)


def make_model() -> nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank, and for DDP and FSDP alike
    return nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )


def shard(model: nn.Module, device: torch.device) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)  # each Linear is gathered only while it computes
    return fully_shard(model, mesh=mesh)


def main() -> None:
    args = parse_args()
    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_cuda else "gloo")  # torchrun's environment
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch_size % world:
        raise SystemExit(f"--batch-size {args.batch_size} must divide by the {world} ranks")

    model = make_model().to(device)
    model = nn.parallel.DistributedDataParallel(model) if args.ddp else shard(model, device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    losses = torch.full((args.steps,), float("nan"))
    start = resume(args.checkpoint_dir, model, opt, losses)

    x, y = digits()
    per_rank = args.batch_size // world
    generator = torch.Generator().manual_seed(1)
    order = torch.randperm(len(x), generator=generator)  # the same data order on every rank
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    for step in range(start, args.steps):
        if args.die_at_step == step and rank == world - 1 and restarted == 0:
            print(f"rank {rank} kills itself at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        first = (step * args.batch_size) % (len(x) - args.batch_size)
        batch = order[first : first + args.batch_size][rank * per_rank : (rank + 1) * per_rank]
        loss = F.cross_entropy(model(x[batch].to(device)), y[batch].to(device))
        opt.zero_grad()
        loss.backward()  # FSDP: reduce-scatter (each rank gets its shard's mean gradient)
        opt.step()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        losses[step] = global_loss.item() / world
        if args.checkpoint_dir and (step + 1) % args.save_every == 0:
            save(args.checkpoint_dir, step + 1, model, opt, losses)
    if rank == 0:
        print(f"{'ddp' if args.ddp else 'fsdp'}: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
        if args.losses:
            with open(args.losses, "w") as f:
                json.dump(losses.tolist(), f)
    # The model (DDP's reducer, FSDP's state) goes before its process group, not after it at
    # this function's exit: torch's gloo teardown in that order now and then never returns.
    del model, opt
    dist.barrier()
    dist.destroy_process_group()


def save(folder: str, step: int, model: nn.Module, opt: torch.optim.Optimizer, losses) -> None:
    """Every rank writes its own shards; rank 0 marks the checkpoint complete afterwards."""
    model_state, optim_state = get_state_dict(model, opt)
    path = os.path.join(folder, f"step-{step}")
    dcp.save({"model": model_state, "optim": optim_state, "losses": losses}, checkpoint_id=path)
    dist.barrier()  # every shard is on disk before the checkpoint is named the latest
    if dist.get_rank() == 0:
        with open(os.path.join(folder, LATEST + ".tmp"), "w") as f:
            f.write(f"step-{step}")
        os.replace(os.path.join(folder, LATEST + ".tmp"), os.path.join(folder, LATEST))


def resume(folder: str | None, model: nn.Module, opt: torch.optim.Optimizer, losses) -> int:
    """Load the latest complete checkpoint into this rank's shards; the step to go on from."""
    marker = os.path.join(folder, LATEST) if folder else None
    if marker is None or not os.path.exists(marker):
        return 0
    with open(marker) as f:
        name = f.read().strip()
    model_state, optim_state = get_state_dict(model, opt)
    state = {"model": model_state, "optim": optim_state, "losses": losses}
    dcp.load(state, checkpoint_id=os.path.join(folder, name))  # reads only this rank's shards
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    step = int(name.split("-")[1])
    if dist.get_rank() == 0:
        print(f"resumed from {name} (sharded checkpoint)", flush=True)
    return step


if __name__ == "__main__":
    main()
