"""What every rank runs: read its shard, train epoch by epoch from where the run stopped, and
have rank 0 checkpoint, log and export. Also the forward/loss step the driver tries on a sample
before anything is launched, so a model that cannot eat the data fails on the driver."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hora.checkpoint import Checkpoint
from hora.spark.estimator import feed
from hora.spark.estimator.columns import ColumnSpec
from hora.spark.estimator.events import EpochEvents
from hora.spark.estimator.export import export_model
from hora.spark.estimator.store import CHECKPOINTS, run_folder
from hora.storage import Location
from hora.wire.link import log_to_driver, report

CHECKPOINTS_KEPT = 2


@dataclass
class TrainJob:
    """Everything a rank needs, pickled once by the launcher (model and optimizer together, so
    the optimizer's parameters are still the model's after unpickling)."""

    model: Any
    optimizer: Any
    losses: list[Callable[..., Any]]
    loss_weights: list[float]
    metrics: list[Callable[..., Any]]
    callbacks: list[Any]
    data: feed.PreparedData
    store: Location
    run_id: str
    epochs: int
    batch_size: int
    shuffle: bool
    seed: int
    verbose: int


def as_outputs(output: Any, n_labels: int) -> list[Any]:
    """The model's output as one tensor per label column."""
    if n_labels == 1:
        return [output[0] if isinstance(output, tuple | list) and len(output) == 1 else output]
    if not isinstance(output, tuple | list) or len(output) != n_labels:
        raise ValueError(
            f"there are {n_labels} label columns but the model returned "
            f"{type(output).__name__}; return a tuple with one output per label column"
        )
    return list(output)


def fit_label(output: Any, label: Any) -> Any:
    """A float label shaped like the output when they hold as many values ((N,) against (N, 1)),
    instead of letting the loss broadcast them into an (N, N) mistake."""
    if (
        label.is_floating_point()
        and label.shape != output.shape
        and label.numel() == output.numel()
    ):
        return label.view_as(output)
    return label


def step_loss(job_like: Any, inputs: Sequence[Any], labels: Sequence[Any]) -> tuple[Any, list]:
    """Forward, then the weighted sum of the losses; also the outputs, for metrics."""
    outputs = as_outputs(job_like.model(*inputs), len(labels))
    total = None
    for i, (out, label) in enumerate(zip(outputs, labels, strict=True)):
        value = job_like.losses[i](out, fit_label(out, label)) * job_like.loss_weights[i]
        total = value if total is None else total + value
    return total, outputs


def metric_values(metrics: Sequence[Callable[..., Any]], outputs: list, labels: Sequence) -> list:
    out = outputs[0] if len(outputs) == 1 else outputs
    lab = fit_label(outputs[0], labels[0]) if len(outputs) == 1 else list(labels)
    return [float(m(out, lab)) for m in metrics]


def metric_names(metrics: Sequence[Callable[..., Any]]) -> list[str]:
    names = []
    for m in metrics:
        name = getattr(m, "__name__", None) or type(m).__name__
        while name in names:
            name += "_"
        names.append(name)
    return names


def _device(hvd: Any) -> Any:
    import torch

    if torch.cuda.is_available():
        index = hvd.local_rank() % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def _rng_state() -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _call(callbacks: Sequence[Any], method: str, *args: Any) -> None:
    for callback in callbacks:
        fn = getattr(callback, method, None)
        if fn is not None:
            fn(*args)


def train_on_rank(job: TrainJob) -> None:
    """One rank of a fit. Resumes from the run's newest checkpoint when there is one."""
    import torch

    import hora.torch as hvd  # here: the driver and TorchModel's tasks import this module too

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    device = _device(hvd)
    model = job.model.to(device)
    optimizer = hvd.DistributedOptimizer(job.optimizer, named_parameters=model.named_parameters())
    run = run_folder(job.store, job.run_id)
    checkpoints = Checkpoint(run.location(CHECKPOINTS), CHECKPOINTS_KEPT)
    found = checkpoints.load_and_broadcast()
    history: list[dict[str, float]] = []
    start = 0
    if found is not None:
        start, history = _resume(found.state, model, optimizer, rank, size)
    else:
        torch.manual_seed(feed.epoch_seed(job.seed, -1, rank))
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = job.data
    n_in = len(data.features)
    train = _shard(job, "train", device, rank, size, shuffle=job.shuffle)
    validation = None
    if data.validation is not None:
        validation = _shard(job, "validation", device, rank, size, shuffle=False)
    names = metric_names(job.metrics)
    events = EpochEvents(run) if rank == 0 else None
    _call(job.callbacks, "on_train_begin")
    for epoch in range(start, job.epochs):
        began = time.perf_counter()
        _call(job.callbacks, "on_epoch_begin", epoch)
        logs, rows = _train_epoch(model, optimizer, job, train, names, n_in, epoch, hvd)
        if validation is not None:
            logs.update(_evaluate(model, job, validation, names, n_in, epoch, hvd))
        seconds = time.perf_counter() - began
        history.append(logs)
        rng = hvd.allgather_object(_rng_state(), name=f"estimator.rng.{epoch}")
        checkpoints.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "epoch": epoch + 1,
                "history": history,
                "rng": rng,
                "seed": job.seed,
                "num_proc": size,
            },
            epoch + 1,
        )
        hvd.barrier()  # no rank goes on (or fails) before the epoch's checkpoint is whole
        if rank == 0:
            assert events is not None
            events.write(epoch, logs)
            report({**logs, "rows_per_s": rows / seconds}, step=epoch + 1)  # the fit's progress
        _call(job.callbacks, "on_epoch_end", epoch, dict(logs))
    _call(job.callbacks, "on_train_end", list(history))
    if events is not None:
        events.close()
    if rank == 0 and start < job.epochs:
        example = next(iter(train.all()))[:n_in] if len(train) else None
        export_model(model, example, run)
    hvd.shutdown()


def _resume(
    state: dict[str, Any], model: Any, optimizer: Any, rank: int, size: int
) -> tuple[int, list[dict[str, float]]]:
    """Load a checkpoint's model, optimizer and random state; the epoch to go on from and the
    history so far."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    states = state["rng"]
    if len(states) == size:
        _set_rng_state(states[rank])
    elif rank == 0:
        log_to_driver(
            f"hora: the run was trained on {len(states)} ranks and continues on {size}: "
            "the epochs after the resume are not those of an uninterrupted run"
        )
    return state["epoch"], list(state["history"])


class _Job:
    """A model with a job's losses, for `step_loss` (the device-moved model, not job.model)."""

    def __init__(self, model: Any, job: Any) -> None:
        self.model = model
        self.losses = job.losses
        self.loss_weights = job.loss_weights


def _shard(
    job: TrainJob, split: str, device: Any, rank: int, size: int, shuffle: bool
) -> feed.Batches:
    """This rank's share of the data written for `split`, in batches."""
    specs: list[ColumnSpec] = [*job.data.features, *job.data.labels]
    dataset = job.data.train if split == "train" else job.data.validation
    assert dataset is not None
    return feed.Batches(
        dataset,
        job.data.names,
        specs,
        job.batch_size,
        device,
        rank,
        size,
        shuffle=shuffle,
        seed=job.seed,
    )


def _train_epoch(
    model: Any,
    optimizer: Any,
    job: TrainJob,
    batches: feed.Batches,
    names: list[str],
    n_in: int,
    epoch: int,
    hvd: Any,
) -> tuple[dict[str, float], float]:
    """One epoch of this rank's shard; the loss and metrics over every rank's rows (summed
    here, added up by one allreduce), and how many rows that was."""
    import torch

    model.train()
    sums = torch.zeros(2 + len(names), dtype=torch.float64)
    for batch in batches.epoch(epoch):
        inputs, labels = batch[:n_in], batch[n_in:]
        optimizer.zero_grad()
        loss, outputs = step_loss(_Job(model, job), inputs, labels)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            sums += _weighted_row(job, loss, outputs, labels)
    totals = hvd.allreduce(sums, op=hvd.Sum, name=f"estimator.train.{epoch}")
    all_rows = totals[0].item()
    return _means(totals, names, all_rows, prefix=""), all_rows


def _evaluate(
    model: Any,
    job: TrainJob,
    batches: feed.Batches,
    names: list[str],
    n_in: int,
    epoch: int,
    hvd: Any,
) -> dict[str, float]:
    """Validation loss and metrics over every validation row of every rank (exact: each rank
    sums over its whole shard, one allreduce adds them up; no collective per batch)."""
    import torch

    model.eval()
    sums = torch.zeros(2 + len(names), dtype=torch.float64)
    with torch.no_grad():
        for batch in batches.all():
            inputs, labels = batch[:n_in], batch[n_in:]
            loss, outputs = step_loss(_Job(model, job), inputs, labels)
            sums += _weighted_row(job, loss, outputs, labels)
    totals = hvd.allreduce(sums, op=hvd.Sum, name=f"estimator.validation.{epoch}")
    return _means(totals, names, max(totals[0].item(), 1.0), prefix="val_")


def _weighted_row(job: TrainJob, loss: Any, outputs: Any, labels: list[Any]) -> Any:
    """[rows, loss * rows, metric * rows, ...] of one batch: what an epoch's sums add up."""
    import torch

    rows = len(labels[0])
    values = [loss.item(), *metric_values(job.metrics, outputs, labels)]
    return torch.tensor([rows, *(v * rows for v in values)], dtype=torch.float64)


def _means(totals: Any, names: list[str], rows: float, prefix: str) -> dict[str, float]:
    """The loss and each metric per row, from every rank's summed `_weighted_row`s."""
    means = {f"{prefix}loss": totals[1].item() / rows}
    means.update({f"{prefix}{n}": totals[2 + i].item() / rows for i, n in enumerate(names)})
    return means
