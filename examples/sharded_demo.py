"""The sharded-training demo: the same digits, each rank holding only half of the model state.

`python examples/sharded_demo.py` (part of `make demo`) runs two unchanged scripts on 2 local
ranks through hora's doors: `fsdp_train.py` (PyTorch's FSDP2, `fully_shard`) with pyspark's
TorchDistributor API, then `deepspeed_train.py` (DeepSpeed ZeRO stage 3) with pyspark's
DeepspeedTorchDistributor API and a dict config, which hora writes for the ranks and removes.
"""

from __future__ import annotations

import os

from hora.spark import DeepspeedTorchDistributor, TorchDistributor

HERE = os.path.dirname(os.path.abspath(__file__))
ZERO3 = {
    "train_micro_batch_size_per_gpu": 16,
    # torch's Adam: DeepSpeed's own is a compiled op (hora builds it once per host, minutes)
    "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}},
    "zero_optimization": {"stage": 3},
}


def main() -> None:
    print("FSDP2 (fully_shard) on 2 ranks:", flush=True)
    TorchDistributor(num_processes=2, use_gpu=False).run(
        os.path.join(HERE, "fsdp_train.py"), "--steps", "60"
    )
    print("DeepSpeed ZeRO-3 on 2 ranks:", flush=True)
    DeepspeedTorchDistributor(numGpus=2, useGpu=False, deepspeedConfig=ZERO3).run(
        os.path.join(HERE, "deepspeed_train.py"), "--steps", "60"
    )


if __name__ == "__main__":
    main()
