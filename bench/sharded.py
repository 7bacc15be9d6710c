"""Sharded training, measured: memory per rank (DDP vs ZeRO-1/2/3 vs FSDP2) and DeepSpeed launch.

    .venv/bin/python bench/sharded.py memory [--only ddp,zero3,...]
    .venv/bin/python bench/sharded.py launch [--reps 3]

memory: a 50.3M-parameter model (12 Linear(2048, 2048) layers) with Adam on 2 ranks, one
configuration at a time (the machine is shared). After two training steps each rank counts the
bytes of the tensors it holds for the model (its parameters or parameter shards, gradients,
optimizer state, and the strategy's own flat buffers: every live tensor, each storage once) and
its peak RSS. DDP and FSDP2 run through `hora.run`, ZeRO through hora's
DeepspeedTorchDistributor. Prints each against DDP (goal: ZeRO-3 and FSDP2 <= 0.55x).

launch: hora's DeepspeedTorchDistributor against pyspark's on the same DeepSpeed script,
`localMode=True` and `local[2]` Spark tasks, alternating: time from `run()` to the end of the
first step, and the steady step rate.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import warnings

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

LAYERS, WIDTH = 12, 2048
TORCH_ADAM = {"type": "Adam", "params": {"lr": 1e-4, "torch_adam": True}}
# DeepSpeed's default buckets (5e8 elements: 1.9 GiB each in fp32) are sized for billions of
# parameters; DDP's are 25 MiB. Buckets of 5M elements (19 MiB) compare like with like.
BUCKETS = {
    "reduce_bucket_size": 5_000_000,
    "allgather_bucket_size": 5_000_000,
    "stage3_prefetch_bucket_size": 5_000_000,
}
CONFIGS = ("ddp", "zero1", "zero2", "zero3", "fsdp2")
MiB = 2**20


def make_model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


def live_tensor_bytes() -> int:
    """Bytes of every live tensor's storage in this process, each storage counted once
    (a DTensor by its local shard; views share their base's storage)."""
    import torch
    from torch.distributed.tensor import DTensor

    seen: dict[int, int] = {}
    warnings.simplefilter("ignore")  # isinstance() on torch's deprecated module attributes
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, torch.Tensor):
                continue
            tensor = obj.to_local() if isinstance(obj, DTensor) else obj
            if isinstance(tensor, torch.nn.Parameter) or type(tensor) is torch.Tensor:
                storage = tensor.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
        except Exception:  # meta tensors, freed storages, tensor subclasses without storage
            continue
    return sum(seen.values())


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _train_two_steps(model, step) -> dict:
    import torch

    x = torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        step(model(x).square().mean())
    gc.collect()
    return {"bytes": live_tensor_bytes(), "rss": peak_rss()}


def ddp_or_fsdp(kind: str) -> dict:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    model = make_model()
    if kind == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step(loss):
        loss.backward()
        opt.step()  # the gradients stay, as they are between backward and zero_grad

    result = _train_two_steps(model, step)
    dist.destroy_process_group()
    return result


def zero(deepspeed_config: dict) -> dict:
    import deepspeed

    deepspeed.init_distributed()
    model = make_model()
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=deepspeed_config
    )
    del model

    def step(loss):
        engine.backward(loss)
        engine.step()

    return _train_two_steps(engine, step)


def measure(kind: str) -> list[dict]:
    import hora
    from hora.spark import DeepspeedTorchDistributor

    if kind in ("ddp", "fsdp2"):
        return hora.run(ddp_or_fsdp, (kind,), np=2, backend="local")
    config = {
        "train_micro_batch_size_per_gpu": 8,
        "optimizer": TORCH_ADAM,
        "zero_optimization": {"stage": int(kind[-1]), **BUCKETS},
    }
    # rank 0's value comes back from the door; every rank's is the same by construction, but
    # report both by running through hora.run's function form would lose the door: use rank 0.
    return [DeepspeedTorchDistributor(2, useGpu=False, deepspeedConfig=config).run(zero)]


def memory(only: list[str]) -> None:
    params = LAYERS * (WIDTH * WIDTH + WIDTH)
    print(f"model: {params / 1e6:.1f}M parameters ({params * 4 / MiB:.0f} MiB in fp32), Adam, "
          "2 ranks; per rank (rank 0):")  # fmt: skip
    rows: dict[str, dict] = {}
    for kind in only:
        rows[kind] = measure(kind)[0]
        ddp = rows.get("ddp")
        ratio = f"{rows[kind]['bytes'] / ddp['bytes']:.2f}x DDP" if ddp else ""
        print(f"  {kind:6s} model-state tensors {rows[kind]['bytes'] / MiB:7.0f} MiB {ratio:>10s}"
              f"   peak RSS {rows[kind]['rss'] / MiB:6.0f} MiB", flush=True)  # fmt: skip
    print(json.dumps({k: {"bytes": v["bytes"], "rss": v["rss"]} for k, v in rows.items()}))


# -- launch ----------------------------------------------------------------------------------
LAUNCH_CONFIG = {
    "train_micro_batch_size_per_gpu": 8,
    "optimizer": TORCH_ADAM,
    "zero_optimization": {"stage": 2},
}
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sharded_script.py")


def launch(reps: int) -> None:
    from pyspark.ml.deepspeed.deepspeed_distributor import (
        DeepspeedTorchDistributor as PysparkDeepspeed,
    )
    from pyspark.sql import SparkSession

    from hora.spark import DeepspeedTorchDistributor as HoraDeepspeed

    spark = (
        SparkSession.Builder().master("local[2]").appName("bench-sharded")
        .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false").config("spark.log.level", "ERROR").getOrCreate()
    )  # fmt: skip
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        for _ in range(reps):
            for local in (True, False):
                for name, door in (("hora", HoraDeepspeed), ("pyspark", PysparkDeepspeed)):
                    times = _one_launch(door, local)
                    results.setdefault((name, "local" if local else "local[2]"), []).append(times)
                    print(f"  {name:8s} {'local' if local else 'local[2]':9s} first step "
                          f"{times[0]:6.2f} s, {times[1]:6.1f} steps/s", flush=True)  # fmt: skip
    finally:
        spark.stop()
    for mode in ("local", "local[2]"):
        hora_first = statistics.median(t[0] for t in results[("hora", mode)])
        spark_first = statistics.median(t[0] for t in results[("pyspark", mode)])
        hora_rate = statistics.median(t[1] for t in results[("hora", mode)])
        spark_rate = statistics.median(t[1] for t in results[("pyspark", mode)])
        print(f"{mode:9s} first step: hora {hora_first:.2f} s, pyspark {spark_first:.2f} s "
              f"({spark_first / hora_first:.2f}x); steps/s: hora {hora_rate:.1f}, "
              f"pyspark {spark_rate:.1f} ({hora_rate / spark_rate:.2f}x)")  # fmt: skip


def _one_launch(door, local: bool) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as out:
        start = time.time()
        door(numGpus=2, localMode=local, useGpu=False, deepspeedConfig=LAUNCH_CONFIG).run(
            SCRIPT, "--out", out
        )
        with open(os.path.join(out, "steps.json")) as f:
            steps = json.load(f)
    first = steps[0] - start
    rate = (len(steps) - 1) / (steps[-1] - steps[1]) if len(steps) > 2 else float("nan")
    return first, rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("memory", "launch"))
    parser.add_argument("--only", default=",".join(CONFIGS))
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if args.what == "memory":
        memory(args.only.split(","))
    else:
        launch(args.reps)


if __name__ == "__main__":
    main()
