"""Client code as its users write it, run unchanged by every launcher the tests compare.

Each job writes what every rank saw (its ranks, its losses, a digest of its weights) to
`<out>/<job>-<rank>.json`, so a launcher that returns nothing (torchrun) is read the same way.
`python tests/clients/_train.py <job> <out>` is the entry torchrun starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

STEPS = 4


def data(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g))


def digest(model: torch.nn.Module) -> str:
    flat = torch.cat([p.detach().flatten().double() for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]


def _write(out: str, job: str, rank: int, result: dict[str, Any]) -> dict[str, Any]:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{job}-{rank}.json"), "w") as f:
        json.dump(result, f)
    return result


# ----- Lightning: Trainer and Fabric, in the layouts given ------------------------------------
def lightning(out: str, layouts: list[tuple[int, int]]) -> dict[str, Any]:
    """Trainer, then Fabric, in each (devices, num_nodes) layout, one after another."""
    torch.set_num_threads(1)
    seen: dict[str, Any] = {}
    for devices, num_nodes in layouts:
        seen[f"trainer {devices}x{num_nodes}"] = _trainer(devices, num_nodes)
        seen[f"fabric {devices}x{num_nodes}"] = _fabric(devices, num_nodes)
    return _write(out, "lightning", int(os.environ["RANK"]), seen)


def _module() -> Any:
    import lightning as L

    class Classifier(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(64, 10)
            self.losses: list[float] = []

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Classifier()


def _trainer(devices: int, num_nodes: int) -> dict[str, Any]:
    import lightning as L

    torch.manual_seed(0)
    model = _module()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        num_nodes=num_nodes,
        strategy="ddp",
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(data(), batch_size=8))
    return {
        "environment": type(trainer.strategy.cluster_environment).__name__,
        "ranks": [trainer.global_rank, trainer.local_rank, trainer.node_rank, trainer.world_size],
        "losses": model.losses,
        "weights": digest(model),
    }


def _fabric(devices: int, num_nodes: int) -> dict[str, Any]:
    import lightning as L

    fabric = L.Fabric(accelerator="cpu", devices=devices, num_nodes=num_nodes, strategy="ddp")
    fabric.launch()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(DataLoader(data(), batch_size=8))
    losses = []
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    return {
        "environment": type(fabric.strategy.cluster_environment).__name__,  # type: ignore[attr-defined]
        "ranks": [fabric.global_rank, fabric.local_rank, fabric.node_rank, fabric.world_size],
        "losses": losses,
        "weights": digest(model),
    }


# ----- Hugging Face: Accelerate, then Trainer ----------------------------------------------------
def huggingface(out: str) -> dict[str, Any]:
    torch.set_num_threads(1)
    seen = {"accelerate": _accelerate(), "trainer": _hf_trainer(out)}
    return _write(out, "huggingface", int(os.environ["RANK"]), seen)


def _accelerate() -> dict[str, Any]:
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(
        model, optimizer, DataLoader(data(), batch_size=8)
    )
    losses = []
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    return {
        "ranks": [
            accelerator.process_index,
            accelerator.local_process_index,
            accelerator.num_processes,
        ],
        "losses": losses,
        "weights": digest(accelerator.unwrap_model(model)),
    }


def _hf_trainer(out: str) -> dict[str, Any]:
    """A two-layer BERT built from its config (no download), fed token ids directly."""
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    config = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=2,
    )
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 50, (32, 8), generator=g)
    labels = torch.randint(0, 2, (32,), generator=g)
    rows = [{"input_ids": ids[i], "labels": labels[i]} for i in range(32)]
    args = TrainingArguments(
        output_dir=os.path.join(out, "hf"),
        per_device_train_batch_size=4,
        max_steps=STEPS,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=rows)
    trainer.train()
    return {
        "ranks": [args.process_index, args.local_process_index, args.world_size],
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "weights": digest(model),
    }


# ----- Horovod's classic loop, fp16 compression -------------------------------------------------
def horovod_fp16(out: str) -> dict[str, Any]:
    """horovod/examples' shape: init, shard, scale lr, wrap the optimizer, broadcast, train."""
    import numpy as np
    from sklearn.datasets import load_digits

    import hora.torch as hvd  # was: import horovod.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x[hvd.rank() :: hvd.size()] / 16.0, dtype=torch.float32)
    y = torch.tensor(y[hvd.rank() :: hvd.size()].astype(np.int64))
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    losses = []
    for start in range(0, 32 * STEPS, 32):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[start : start + 32]), y[start : start + 32])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    seen = {
        "ranks": [hvd.rank(), hvd.local_rank(), hvd.size()],
        "losses": losses,
        "weights": digest(model),
    }
    hvd.shutdown()
    return _write(out, "horovod_fp16", seen["ranks"][0], seen)


JOBS = {"lightning": lightning, "huggingface": huggingface, "horovod_fp16": horovod_fp16}

if __name__ == "__main__":
    job, out, *rest = sys.argv[1:]
    if job == "lightning":
        lightning(out, json.loads(rest[0]))
    else:
        JOBS[job](out)
