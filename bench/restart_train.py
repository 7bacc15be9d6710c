"""The job `bench/restart.py` times: a checkpointed loop in which rank 1 SIGKILLs itself once.

Runs as a script (`hora run` / `torchrun`: `restart_train.py FOLDER`) and as a function
(`Runner.run(main, folder=...)`). Plain torch.distributed with hora.checkpoint, so the same file
runs unchanged under both launchers. Rank 1 kills itself at step KILL_STEP unless FOLDER/kill.json
exists (it writes the kill time there first); rank 0 writes when the process started, when the
checkpoint was loaded and when the first training step of each process ended.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

STEPS = 30
KILL_STEP = 17
SAVE_EVERY = 5
WIDTH = 512  # 4 layers of 512 x 512: ~1 M parameters, 8 MB of checkpoint with momentum


def main(folder: str) -> int:
    import psutil
    import torch
    import torch.distributed as dist
    from torch import nn

    from hora.checkpoint import Checkpoint

    imported = time.time()
    dist.init_process_group("gloo")
    connected = time.time()
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    model = nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    ckpt = Checkpoint(os.path.join(folder, "checkpoints"), keep=2)
    found = ckpt.load_and_broadcast()
    start = 0
    if found is not None:
        model.load_state_dict(found.state["model"])
        opt.load_state_dict(found.state["optimizer"])
        start = found.step + 1
    else:
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
    loaded = time.time()
    kill_file = Path(folder, "kill.json")
    for step in range(start, STEPS):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(64, WIDTH, generator=g)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= size
        opt.step()
        if step == start and rank == 0:
            event = {
                "created": psutil.Process().create_time(),
                "imported": imported,
                "connected": connected,
                "loaded": loaded,
                "first_step": time.time(),
                "start": start,
            }
            with Path(folder, "events.jsonl").open("a") as f:
                f.write(json.dumps(event) + "\n")
        if step == KILL_STEP and rank == 1 and not kill_file.exists():
            kill_file.write_text(json.dumps({"time": time.time()}))
            os.kill(os.getpid(), signal.SIGKILL)
        if step % SAVE_EVERY == 0:
            ckpt.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, step)
    dist.destroy_process_group()
    return start


if __name__ == "__main__":
    main(sys.argv[1])
