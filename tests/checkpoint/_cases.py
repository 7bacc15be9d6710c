"""What each rank of the 2-rank checkpoint job does; test_checkpoint.py asserts the results.

Rank 0 gets a directory it can write; rank 1 a path under a regular file, which cannot exist on
any machine, so rank 1 succeeds only if it never touches the filesystem ("only rank 0 sees the
checkpoint directory").
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch


def _directory_for_this_rank(shared: str, hidden: str) -> str:
    return shared if int(os.environ["RANK"]) == 0 else hidden


def _outcome(call: Any) -> Any:
    try:
        found = call()
    except Exception as e:
        return f"raised {type(e).__name__}"
    if found is None:
        return None
    return found.step, found.state["saved_by"], found.state["w"].tolist()


def run(root: str, hidden: str, from_driver: Any) -> dict[str, Any]:
    """Every case in one job; one value per case, compared across ranks by the test."""
    import torch.distributed as dist

    from hora.checkpoint import Checkpoint

    rank = int(os.environ["RANK"])
    out: dict[str, Any] = {}

    # A Checkpoint made on the driver and shipped with the function works on the ranks.
    out["from driver save"] = from_driver.save({"saved_by": rank, "w": torch.ones(1)}, 5)

    # Before any process group exists, the rank comes from the launcher's environment.
    own = os.path.join(root, f"env-rank{rank}")
    env_ckpt = Checkpoint(own)
    out["env save"] = env_ckpt.save({"saved_by": rank, "w": torch.ones(2)}, 1)
    out["env dir exists"] = os.path.isdir(own)

    def state(step: int) -> dict[str, Any]:
        return {"saved_by": rank, "w": torch.full((3,), float(step + rank))}

    # torch.distributed alone (no hvd.init yet): broadcast_object_list carries the state.
    dist.init_process_group("gloo")
    ckpt = Checkpoint(_directory_for_this_rank(os.path.join(root, "dist"), hidden), keep=2)
    out["dist empty"] = _outcome(ckpt.load_and_broadcast)
    for step in (1, 2, 3):
        ckpt.save(state(step), step)
    out["dist loaded"] = _outcome(ckpt.load_and_broadcast)

    # hora.torch: its broadcast_object carries the state.
    import hora.torch as hvd

    hvd.init()
    ckpt = Checkpoint(_directory_for_this_rank(os.path.join(root, "hvd"), hidden))
    out["hvd empty"] = _outcome(ckpt.load_and_broadcast)
    for step in (9, 10):
        out[f"hvd save {step}"] = ckpt.save(state(step), step) is not None
    out["hvd loaded"] = _outcome(ckpt.load_and_broadcast)

    # Rank 0 cannot read (weights_only refuses a NumPy array): every rank raises, none waits.
    ckpt.save({"saved_by": rank, "w": torch.zeros(1), "numpy": np.zeros(2)}, 11)
    out["hvd unreadable"] = _outcome(ckpt.load_and_broadcast)
    out["hvd unreadable, trusted"] = _outcome(lambda: ckpt.load_and_broadcast(weights_only=False))
    # README's resume-by-hand pattern: stopped after 6 of 10 steps and run again, it ends with
    # the weights of an uninterrupted run and runs each step once.
    whole = _train(_directory_for_this_rank(os.path.join(root, "whole"), hidden), 10)
    resumed = _directory_for_this_rank(os.path.join(root, "resumed"), hidden)
    first = _train(resumed, 10, stop_at=6)
    second = _train(resumed, 10)
    out["resume by hand"] = (whole == (second[0], 10), first[1], second[1])
    hvd.shutdown()
    dist.destroy_process_group()
    return out


def _train(directory: str, total_steps: int, stop_at: int | None = None) -> tuple[list, int]:
    """README's pattern on a tiny model; (final weights, steps this call ran)."""
    import hora.torch as hvd
    from hora.checkpoint import Checkpoint

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    ckpt = Checkpoint(directory, keep=2)
    found = ckpt.load_and_broadcast()
    done = 0
    if found:
        model.load_state_dict(found.state["model"])
        opt.load_state_dict(found.state["optimizer"])
        done = found.step
    else:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    ran = 0
    for step in range(done, total_steps):
        if step == stop_at:
            break
        batch = torch.Generator().manual_seed(1000 * step + hvd.rank())
        x = torch.randn(8, 4, generator=batch)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        opt.step()
        ran += 1
        if (step + 1) % 3 == 0:
            ckpt.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, step + 1)
    weights = [p.detach().flatten().tolist() for p in model.parameters()]
    return weights, ran
