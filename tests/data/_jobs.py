"""What the ranks of the data door's tests run: module-level, so every engine can ship them."""

from __future__ import annotations

from typing import Any


def ids_per_epoch(dataset: Any, batch_size: int, shuffle: bool, epochs: int) -> dict[str, Any]:
    """Each epoch's ids as this rank saw them, with its rank, size and batch count."""
    from hora import environment

    here = environment.current()
    loader = dataset.loader(batch_size, shuffle=shuffle, seed=3, columns=["id", "x"])
    seen = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        ids: list[int] = []
        for batch in loader:
            assert batch["x"].shape[1:] == (2,), batch["x"].shape
            ids += batch["id"].tolist()
        seen.append(ids)
    return {"rank": here.rank, "size": here.size, "ids": seen}


def ids_each_way(dataset: Any, batch_size: int, epochs: int) -> dict[str, Any]:
    """`epochs` shuffled epochs of ids, then one in order, with this rank's host."""
    import socket

    shuffled = ids_per_epoch(dataset, batch_size, True, epochs)
    ordered = ids_per_epoch(dataset, batch_size, False, 1)["ids"][0]
    return {**shuffled, "ordered": ordered, "host": socket.gethostname()}


def ids_of_each(datasets: list[Any], batch_size: int, epochs: int) -> dict[str, Any]:
    """`epochs` shuffled epochs of ids of each dataset in turn (one job for several), with this
    rank's host."""
    import socket

    seen = [ids_per_epoch(dataset, batch_size, True, epochs) for dataset in datasets]
    return {**seen[0], "each": [s["ids"] for s in seen], "host": socket.gethostname()}


def ids_by_horovod_runner(dataset: Any, batch_size: int, shuffle: bool) -> list[int]:
    """HorovodRunner's main: rank 0 returns every rank's ids of one epoch (gathered)."""
    import hora.torch as hvd

    hvd.init()
    ids: list[int] = []
    for batch in dataset.loader(batch_size, shuffle=shuffle, columns=["id"]):
        ids += batch["id"].tolist()
    return [i for part in hvd.allgather_object(ids) for i in part]


def elastic_ids(
    dataset: Any, folder: str, epochs: int, batch_size: int, num_workers: int = 0
) -> int:
    """hvd.elastic with the loader in TorchState: each step's ids logged with its commit, so a
    test keeps the steps the final state contains. Paced (slowly while alone), so that the run
    grows mid-epoch.
    With `num_workers`, the loader's workers make the batches."""
    import json
    import os
    import time
    from pathlib import Path

    import torch

    import hora.torch as hvd

    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    attempt = int(os.environ.get("HORA_RESTART_COUNT", "0"))
    net = torch.nn.Linear(3, 1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.01), named_parameters=net.named_parameters()
    )
    loader = dataset.loader(batch_size, shuffle=True, columns=["id", "x"], num_workers=num_workers)
    state = hvd.elastic.TorchState(net, opt, loader=loader, epoch=0)
    log = Path(folder, f"log-{attempt}-{rank}.jsonl")

    @hvd.elastic.run
    def loop(state: Any) -> None:
        while state.epoch < epochs:
            state.loader.set_epoch(state.epoch)
            for batch in state.loader:
                opt.zero_grad()
                net(batch["x"]).sum().backward()
                opt.step()
                entry = {"epoch": state.epoch, "commit": state.commit_index, "world": world}
                with log.open("a") as f:
                    f.write(json.dumps({**entry, "ids": batch["id"].tolist()}) + "\n")
                # alone, slower: the growth (a process to start under a loaded CI) lands
                # well inside epoch 0; once grown, quick
                time.sleep(0.05 if hvd.size() > 1 else 0.3)
                state.commit()
            state.epoch += 1
            state.commit()

    loop(state)
    return world


def tf_ids(dataset: Any, epochs: int) -> list[list[int]]:
    """Each epoch's ids of this rank's `tf_dataset` (rank and size from the environment)."""
    seen = []
    for epoch in range(epochs):
        data = dataset.tf_dataset(8, columns=["id", "x"], epoch=epoch)
        assert data.element_spec["x"].shape.as_list() == [None, 3]
        seen.append([int(i) for batch in data for i in batch["id"].numpy()])
    return seen
