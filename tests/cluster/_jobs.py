"""What the ranks run in the multi-host tests; each job says where its ranks ran (`where`).

The training job (`train`) is deterministic: the model comes from a fixed seed, every step's
batch from the step and the rank, and the optimizer (SGD with momentum) is checkpointed with the
model, so an attempt that resumes from step k-1 trains exactly as an uninterrupted run would, and
`reference` trains the same model in one process on the whole batch of every step.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

STEPS = 12
ROWS_PER_RANK = 16
HOST_MARK = "kill-host"  # the file a rank writes when the test must make its host vanish


def where() -> dict[str, Any]:
    """This rank's host (its UTS hostname) and the placement the launcher gave it."""
    names = ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE")
    return {"host": socket.gethostname()} | {n: int(os.environ[n]) for n in names}


def attempt() -> int:
    return int(os.environ.get("HORA_RESTART_COUNT", "0"))


# ----- collectives --------------------------------------------------------------------------------
def conformance() -> dict[str, Any]:
    """The collective conformance cases (tests/collectives/_cases.py) on this rank; whether a
    1 MiB allreduce went through shared memory for the ranks of this host (the hierarchical
    path), and the hosts that path grouped the ranks into."""
    import hora.torch as hvd
    from hora.collectives._control import state as _state
    from hora.collectives._data import transports as _backends
    from tests.collectives import _cases

    hvd.init()
    before = dict(_backends.stats)
    hvd.allreduce(torch.ones(1 << 18), name="within.host")
    calls = {
        k: _backends.stats.get(k, 0) - before.get(k, 0)
        for k in ("shm_allreduce_calls", "hierarchical_allreduce_calls")
    }
    hierarchy = _state.get().groups[0].hierarchy
    grouped = None if hierarchy is None else hierarchy.hosts
    hvd.shutdown()
    return {"where": where(), "cases": _cases.run_all(), "hierarchy_hosts": grouped, **calls}


def allreduce_until_cut_off(folder: str) -> None:
    """Allreduce in a loop; every rank marks once it is in the loop, so the test can cut a
    host off mid-collective. Ends only by an error (or by being stopped)."""
    import hora.torch as hvd

    hvd.init()
    hvd.allreduce(torch.ones(1), name="warm")
    Path(folder, f"looping-{hvd.rank()}").write_text(socket.gethostname())
    while True:
        hvd.allreduce(torch.ones(1 << 16), name="looping")
        time.sleep(0.01)


# ----- training ------------------------------------------------------------------------------
def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(ROWS_PER_RANK, 6, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def train(
    folder: str | None = None, fault: str | None = None, fault_step: int = 0
) -> dict[str, Any]:
    """STEPS steps of hora.torch's DistributedOptimizer, with a checkpoint after every step
    when `folder` is given. In attempt 0, rank 1 meets `fault` at `fault_step`, after the
    step's gradients were averaged and before the step's loss is (a collective the other
    ranks then wait in, so that none saves that step): "kill_executor" kills the Spark
    executor it runs under, "kill_host" asks the test to make its host vanish. `seconds`: how long
    the steps took (not the start, whose ranks may wait for each other's Spark task)."""
    import hora.torch as hvd
    from hora.checkpoint import Checkpoint
    from tests.restart._cases import resume

    hvd.init()
    rank = hvd.rank()
    model = _model()
    opt = hvd.DistributedOptimizer(_optimizer(model), named_parameters=model.named_parameters())
    ckpt = Checkpoint(os.path.join(folder, "checkpoints"), keep=2) if folder else None
    start = resume(ckpt, model, opt, hvd)
    began = time.monotonic()
    for step in range(start, STEPS):
        x, y = _batch(step, rank)
        opt.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
        if fault and step == fault_step and rank == 1 and attempt() == 0:
            _meet(fault, folder)
        hvd.allreduce(loss.detach(), name="loss")
        if ckpt:
            ckpt.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, step)
    seconds = time.monotonic() - began
    hvd.shutdown()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    placed = {"where": where(), "start": start, "attempt": attempt()}
    return placed | {"weights": weights, "seconds": seconds}


def _meet(fault: str, folder: str | None) -> None:
    if fault == "kill_executor":
        from tests.restart._cases import _kill_executor_jvm

        _kill_executor_jvm()
    elif fault == "kill_host":
        assert folder is not None
        Path(folder, HOST_MARK).write_text(socket.gethostname())
    else:
        raise ValueError(fault)
    time.sleep(3600)  # as a lost host: this rank trains no further


def reference(world: int) -> dict[str, torch.Tensor]:
    """What `train` on `world` ranks must end with: one process, each step on every rank's
    batch at once (the mean loss over all of them: the average of the ranks' gradients)."""
    model = _model()
    opt = _optimizer(model)
    for step in range(STEPS):
        batches = [_batch(step, rank) for rank in range(world)]
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        opt.zero_grad()
        (model(x) - y).pow(2).mean().backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ----- the doors: the estimator, MirroredStrategyRunner, DeepSpeed -------------------------------
# Their runners return rank 0's value (or nothing), so each rank writes what it saw to a shared
# folder (every namespaced host sees the driver's files: only /dev/shm is a host's own).
def _save(folder: str, seen: dict[str, Any]) -> dict[str, Any]:
    seen = {"where": where()} | seen
    Path(folder, f"rank{seen['where']['RANK']}.json").write_text(json.dumps(seen))
    return seen


def saved(folder: str | Path) -> list[dict[str, Any]]:
    """What `_save` wrote, in rank order."""
    found = [json.loads(p.read_text()) for p in Path(folder).glob("rank*.json")]
    return sorted(found, key=lambda s: s["where"]["RANK"])


class SavePlace:
    """An estimator callback: each rank saves where it trained when training begins."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def on_train_begin(self) -> None:
        _save(self.folder, {})


MWMS_START, MWMS_LR, MWMS_STEPS = 1.0, 0.1, 2


def mwms_steps(folder: str) -> dict[str, Any]:
    """Under MirroredStrategyRunner's MultiWorkerMirroredStrategy: MWMS_STEPS custom-loop steps
    (strategy.run) of gradient descent on a mirrored w, where worker i's loss is (w - (i + 1))^2
    and the replicas' updates are averaged; and an all-reduced sum of the workers' indices.
    Saves its TF_CONFIG and what it computed."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    config = json.loads(os.environ["TF_CONFIG"])
    target = float(config["task"]["index"] + 1)
    w = tf.Variable(MWMS_START, aggregation=tf.VariableAggregation.MEAN)  # in the scope

    def replica_step() -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = (w - target) ** 2
        w.assign_sub(MWMS_LR * tape.gradient(loss, w))  # MEAN: every worker's update averaged
        return tf.constant(target - 1)

    @tf.function
    def step() -> tf.Tensor:
        index = strategy.run(replica_step)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, index, axis=None)

    sums = [float(step().numpy()) for _ in range(MWMS_STEPS)]
    return _save(
        folder,
        {
            "tf_config": config,
            "mwms": isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy),
            "replicas": strategy.num_replicas_in_sync,
            "index_sums": sums,
            "w": float(w.numpy()),
        },
    )


def mwms_expected_w(workers: int) -> float:
    """`mwms_steps`' w in plain Python: each step moves w by lr times the mean gradient."""
    w = MWMS_START
    for _ in range(MWMS_STEPS):
        w -= MWMS_LR * sum(2 * (w - (i + 1)) for i in range(workers)) / workers
    return w


def lightning(out: str, layouts: list[tuple[int, int]]) -> dict[str, Any]:
    """tests/clients' Lightning job (Trainer, then Fabric, in each (devices, num_nodes) layout),
    which writes what Lightning saw to `<out>/lightning-<rank>.json`; saves where it ran beside
    it, read before Lightning starts."""
    from tests.clients import _train

    place = where()
    seen = _train.lightning(out, layouts)
    Path(out, f"rank{place['RANK']}.json").write_text(json.dumps({"where": place}))
    return seen


def deepspeed_losses(
    out: str, ninja_folder: str | None, deepspeed_config: dict | None = None
) -> dict[str, Any]:
    """tests/deepspeed's training function (a tiny MLP on digits under deepspeed.initialize),
    saving where it ran. `ninja_folder` first on the PATH: the ninja the driver's DeepSpeed
    uses. The ops that `make deepspeed-ops` built in the shared extension cache are loaded through
    ninja, whose build log a ninja of another version does not read: the executors' PATH (the
    virtualenv's ninja first) would rebuild them, and the driver's next load rebuild them back
    (a minute each on 2 cores)."""
    from tests.deepspeed import _ranks

    if ninja_folder:
        os.environ["PATH"] = ninja_folder + os.pathsep + os.environ["PATH"]
    return _save(out, _ranks.train(deepspeed_config))
