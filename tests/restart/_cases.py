"""Training jobs that fail on purpose in their first attempt and resume from a checkpoint.

Every step's batch depends only on the step and the rank, the model on a fixed seed, and the
optimizer (SGD with momentum) is checkpointed with the model: an attempt that resumes from the
checkpoint of step k-1 trains exactly as an uninterrupted run would from there.

Rank 0 appends "<attempt> <step>" to `steps.txt` once a step's checkpoint is saved, so the log
tells which steps each attempt completed. The failure is placed where it is deterministic: rank 1
dies after the step's gradients were averaged but before the step's loss is (a collective rank 0
is then stuck in), so rank 0 has saved and logged step k-1 and never saves step k.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

EPOCHS = 5
STEPS_PER_EPOCH = 4
#: the middle of epoch 3 (of 5): step 2 of its 4
MID_EPOCH_3 = 2 * STEPS_PER_EPOCH + 2


def attempt() -> int:
    return int(os.environ["HORA_RESTART_COUNT"])


def resume(ckpt: Any, model: Any, opt: Any, hvd: Any) -> int:
    """The first step this attempt trains: after the last checkpoint of `ckpt` (model and
    optimizer loaded on every rank), else 0, with rank 0's parameters broadcast."""
    found = ckpt.load_and_broadcast() if ckpt is not None else None
    if found is None:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        return 0
    model.load_state_dict(found.state["model"])
    opt.load_state_dict(found.state["optimizer"])
    return int(found.step) + 1


def _fail(how: str) -> None:
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "raise":
        raise RuntimeError("deliberate failure in attempt 0")
    elif how == "kill_executor":
        _kill_executor_jvm()
        time.sleep(3600)  # as a lost executor: this rank trains no further
    else:
        raise ValueError(how)


def _kill_executor_jvm() -> None:
    """SIGKILL the Spark executor JVM this rank runs under (found up the process tree)."""
    import psutil

    for parent in psutil.Process().parents():
        if any("CoarseGrainedExecutorBackend" in part for part in parent.cmdline()):
            print(f"killing executor JVM {parent.pid}", flush=True)
            parent.kill()
            return
    raise RuntimeError("this rank does not run under a Spark executor")


def train(folder: str, fail_step: int | None = None, how: str = "sigkill") -> dict[str, Any]:
    """Train EPOCHS x STEPS_PER_EPOCH steps on 2 ranks with a checkpoint after every step;
    rank 1 fails at `fail_step` in attempt 0. Returns the final weights and where it resumed."""
    import torch
    from torch import nn

    import hora
    import hora.torch as hvd
    from hora.checkpoint import Checkpoint

    hvd.init()
    rank = hvd.rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    ckpt = Checkpoint(os.path.join(folder, "checkpoints"), keep=2)
    start = resume(ckpt, model, opt, hvd)
    hora.log_to_driver(f"rank {rank}: attempt {attempt()} starts at step {start}")
    log = Path(folder, "steps.txt")
    for step in range(start, EPOCHS * STEPS_PER_EPOCH):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(16, 6, generator=g)
        y = x.sum(dim=1, keepdim=True).sin()
        opt.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
        if step == fail_step and rank == 1 and attempt() == 0:
            _fail(how)
        hvd.allreduce(loss.detach(), name="loss")  # the metric every loop logs
        ckpt.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, step)
        if rank == 0:
            with log.open("a") as f:
                f.write(f"{attempt()} {step}\n")
    hvd.shutdown()
    return {"weights": {k: v.clone() for k, v in model.state_dict().items()}, "start": start}


def steps_done(folder: str) -> list[tuple[int, int]]:
    """(attempt, step) for every step whose checkpoint rank 0 saved, in order."""
    text = Path(folder, "steps.txt").read_text()
    return [(int(a), int(s)) for a, s in (line.split() for line in text.splitlines())]


def always_fails(folder: str) -> None:
    """Rank 1 fails in every attempt; each attempt leaves a mark, so they can be counted."""
    rank = int(os.environ["RANK"])
    Path(folder, f"attempt-{attempt()}-rank-{rank}").touch()
    if rank == 1:
        raise RuntimeError(f"always fails (attempt {attempt()})")
    time.sleep(3600)


def elastic_then_lost(folder: str) -> dict[str, Any]:
    """hvd.elastic and disk checkpoints together.

    Attempt 0: at step 5 a collective fails on every rank (mismatched shapes, a
    HorovodInternalError): hvd.elastic restores the last in-memory commit and goes on, in the
    same processes. At step 9 rank 1's process is killed: no in-memory state survives that, so
    hora restarts the group and the new attempt resumes from the last checkpoint on disk (saved
    every 4 steps: the new attempt starts at step 9). Rank 0 notes each in-job reset in
    `resets.txt`. Returns where this attempt started and the weights.
    """
    import torch
    from torch import nn

    import hora.torch as hvd
    from hora.checkpoint import Checkpoint

    hvd.init()
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    ckpt = Checkpoint(os.path.join(folder, "checkpoints"), keep=1)
    found = ckpt.load_and_broadcast()
    step = 0
    if found is not None:
        model.load_state_dict(found.state["model"])
        opt.load_state_dict(found.state["optimizer"])
        step = found.step + 1
    state = hvd.elastic.TorchState(model, opt, step=step)

    def note_reset() -> None:
        if hvd.rank() == 0:
            with Path(folder, "resets.txt").open("a") as f:
                f.write(f"{attempt()} {state.step}\n")

    state.register_reset_callbacks([note_reset])
    failed: list[bool] = []

    @hvd.elastic.run
    def loop(state: hvd.elastic.TorchState) -> None:
        while state.step < 12:
            first = attempt() == 0
            if state.step == 5 and first and not failed:
                failed.append(True)
                hvd.allreduce(torch.ones(2 + hvd.rank()), name="elastic.mismatch")
            g = torch.Generator().manual_seed(1000 * state.step + hvd.rank())
            x = torch.randn(8, 4, generator=g)
            state.optimizer.zero_grad()
            (state.model(x) - x.sum(1, keepdim=True)).pow(2).mean().backward()
            state.optimizer.step()
            if state.step == 9 and first and hvd.rank() == 1:
                os.kill(os.getpid(), signal.SIGKILL)  # rank 0 saved step 8: it is in step 9
            if state.step % 4 == 0:
                ckpt.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, state.step)
            state.step += 1
            state.commit()

    loop(state)
    hvd.shutdown()
    return {"start": step, "weights": [p.detach().clone() for p in model.parameters()]}
