"""What the DeepSpeed door's ranks run in the tests: a `deepspeed`-launcher script and a function
(and an op load, as DeepSpeed's engine does it).

Each trains a tiny model with `deepspeed.initialize` for a few steps on real data and reports
what it saw (its config path and whether the file was there, its place, its losses) as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def train(config: dict | str | None, fail_rank: int | None = None) -> dict:
    import deepspeed
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from torch import nn

    deepspeed.init_distributed()  # no arguments: the launcher's environment
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    rank = engine.global_rank
    if fail_rank == rank:
        raise RuntimeError(f"rank {rank} fails on purpose")
    data = load_digits()
    x = torch.tensor(data.data / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target)
    micro = engine.train_micro_batch_size_per_gpu()
    losses = []
    for step in range(15):
        first = (step * micro * engine.world_size + rank * micro) % (len(x) - micro)
        loss = F.cross_entropy(engine(x[first : first + micro]), y[first : first + micro])
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return {
        "rank": rank,
        "world": engine.world_size,
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "stage": engine.zero_optimization_stage(),
        "losses": losses,
    }


def function(out: str, deepspeed_config: dict | None = None) -> dict:
    """The function form: the distributor gives the config through `deepspeed_config=`."""
    seen = train(deepspeed_config) | {"config": deepspeed_config}
    with open(os.path.join(out, f"rank{seen['rank']}.json"), "w") as f:
        json.dump(seen, f)
    return seen


def load_op(builder: str) -> str:
    """What DeepSpeed does when its engine needs an op (its FusedAdam: FusedAdamBuilder)."""
    from deepspeed.accelerator import get_accelerator

    get_accelerator().create_op_builder(builder).load()
    return builder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)  # deepspeed's launcher passes it
    parser.add_argument("--out", required=True)
    parser.add_argument("--fail-rank", type=int, default=None)
    parser.add_argument("--deepspeed", action="store_true")
    parser.add_argument("--deepspeed_config", default=None)
    args = parser.parse_args()
    path = args.deepspeed_config
    seen = {
        "argv": sys.argv[1:],
        "config_path": path,
        "config_existed": bool(path) and os.path.isfile(path),
    }
    seen |= train(path, args.fail_rank)
    with open(os.path.join(args.out, f"rank{seen['rank']}.json"), "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
