"""Training steps per second: hvd.DistributedOptimizer vs torch DDP vs one process.

On 2 ranks, in the same job and alternating rounds, the same model is trained with
`hvd.DistributedOptimizer` and with `torch.nn.parallel.DistributedDataParallel` (default
buckets), and without any exchange (each rank alone: "no-comm", the ceiling); a 1-rank job then
trains it alone with the plain optimizer, same per-rank batch.
Models: (a) an MLP of 50 small Linear layers (many small gradients: fusion matters) and (b) a
small CNN. Scaling efficiency = samples/s on 2 ranks / (2 x samples/s on 1 process); the
physical limit on a 2-core machine is 1.0 (2.0x). Rank 0's milliseconds per step in forward,
backward and `step()` show where each side pays for its exchange (DDP in backward,
DistributedOptimizer in `step()`).

hora's allreduce goes through shared memory here (one host); `--no-shm` keeps it on gloo, as DDP.

`--protocol separate` measures as issue 14 did, each side on its own: one 2-rank `hora.run` job
per side and round (hvd: `hvd.init()` + `DistributedOptimizer`; DDP: `init_process_group("gloo")`
+ `DistributedDataParallel`, no hora.torch at all), `--warmup` untimed then `--steps` timed steps
(defaults for this protocol: 10 and 60), sides alternating, the order flipped every round. Its
model `mlp64x50` is the issue's: 50 Linear(64, 64) layers, ReLU between, plain SGD.

`--load N` keeps N busy-looping processes running beside the job (a machine with other work).

    .venv/bin/python bench/train_step.py [--steps 30] [--rounds 5] [--batch-size 32] [--no-shm]
    .venv/bin/python bench/train_step.py --protocol separate --rounds 3 [--models mlp64x50 mlp50]
    .venv/bin/python bench/train_step.py ... --load 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import hora


def make_model(kind: str) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    if kind == "mlp64x50":  # issue 14's model
        deep: list[nn.Module] = [nn.Linear(64, 64)]
        for _ in range(49):
            deep += [nn.ReLU(), nn.Linear(64, 64)]
        return nn.Sequential(*deep)
    if kind == "mlp50":
        layers: list[nn.Module] = [nn.Linear(32, 64), nn.ReLU()]
        for _ in range(48):
            layers += [nn.Linear(64, 64), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(64, 10))
    if kind == "wide":  # 26 MB of gradients in seven large layers
        wide: list[nn.Module] = [nn.Linear(256, 1024), nn.ReLU()]
        for _ in range(6):
            wide += [nn.Linear(1024, 1024), nn.ReLU()]
        return nn.Sequential(*wide, nn.Linear(1024, 10))
    hidden = int(kind[3:] or 128)  # "cnn", or "cnn512": its first fully connected layer's width
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, hidden), nn.ReLU(), nn.Linear(hidden, 10),
    )  # fmt: skip


def make_batch(kind: str, batch_size: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(1)
    shapes = {"mlp50": (batch_size, 32), "mlp64x50": (batch_size, 64), "wide": (batch_size, 256)}
    shape = shapes.get(kind, (batch_size, 3, 32, 32))
    return torch.randn(*shape, generator=g), torch.randint(0, 10, (batch_size,), generator=g)


def make_optimizer(kind: str, params: Any) -> Any:
    import torch

    if kind == "mlp64x50":  # the plain SGD
        return torch.optim.SGD(params, lr=0.01)
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


def _steps_per_s(
    model: Any, opt: Any, batch: tuple[Any, Any], steps: int, phases: list[float] | None = None
) -> float:
    """Steps per second; `phases` (if given) accumulates seconds in forward (with zero_grad),
    backward and `step()`: DDP exchanges inside backward, DistributedOptimizer in `step()`."""
    import torch.nn.functional as F

    x, y = batch
    clock = time.perf_counter
    fwd = bwd = opt_step = 0.0
    start = clock()
    for _ in range(steps):
        t0 = clock()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        t1 = clock()
        loss.backward()
        t2 = clock()
        opt.step()
        t3 = clock()
        fwd, bwd, opt_step = fwd + t1 - t0, bwd + t2 - t1, opt_step + t3 - t2
    rate = steps / (clock() - start)
    if phases is not None:
        phases[0], phases[1], phases[2] = phases[0] + fwd, phases[1] + bwd, phases[2] + opt_step
    return rate


def distributed(kind: str, steps: int, rounds: int, batch_size: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import hora.torch as hvd

    hvd.init()
    batch = make_batch(kind, batch_size)
    hvd_model, ddp_base = make_model(kind), make_model(kind)
    hvd_opt = hvd.DistributedOptimizer(
        make_optimizer(kind, hvd_model.parameters()),
        named_parameters=hvd_model.named_parameters(),
    )
    ddp = torch.nn.parallel.DistributedDataParallel(ddp_base)
    ddp_opt = make_optimizer(kind, ddp.parameters())
    alone = make_model(kind)  # each rank on its own, nothing exchanged: the ceiling on 2 ranks
    alone_opt = make_optimizer(kind, alone.parameters())
    sides = {"hvd": (hvd_model, hvd_opt), "ddp": (ddp, ddp_opt), "no-comm": (alone, alone_opt)}
    for model, opt in sides.values():
        _steps_per_s(model, opt, batch, 3)  # warm-up
    rates: dict[str, list[float]] = {k: [] for k in sides}
    phases = {k: [0.0, 0.0, 0.0] for k in sides}
    for r in range(rounds):
        for key in list(sides) if r % 2 == 0 else list(reversed(sides)):
            dist.barrier()
            rates[key].append(_steps_per_s(*sides[key], batch, steps, phases[key]))
    threads = torch.get_num_threads()
    hvd.shutdown()
    ms_per_step = {k: [1e3 * p / (steps * rounds) for p in v] for k, v in phases.items()}
    return {"rates": rates, "threads": threads, "phases": ms_per_step}


def single(kind: str, steps: int, rounds: int, batch_size: int) -> dict[str, Any]:
    import torch

    model = make_model(kind)
    opt = make_optimizer(kind, model.parameters())
    batch = make_batch(kind, batch_size)
    _steps_per_s(model, opt, batch, 3)
    rates = [_steps_per_s(model, opt, batch, steps) for _ in range(rounds)]
    return {"rates": {"single": rates}, "threads": torch.get_num_threads()}


def separate_hvd(kind: str, warmup: int, steps: int, batch_size: int) -> float:
    """One side of `--protocol separate`: a job that knows only hora.torch."""
    import hora.torch as hvd

    hvd.init()
    model = make_model(kind)
    opt = hvd.DistributedOptimizer(
        make_optimizer(kind, model.parameters()), named_parameters=model.named_parameters()
    )
    batch = make_batch(kind, batch_size)
    _steps_per_s(model, opt, batch, warmup)
    rate = _steps_per_s(model, opt, batch, steps)
    hvd.shutdown()
    return rate


def separate_ddp(kind: str, warmup: int, steps: int, batch_size: int) -> float:
    """The other side: plain torch DDP on gloo, from the environment hora's launcher sets."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    ddp = torch.nn.parallel.DistributedDataParallel(make_model(kind))
    opt = make_optimizer(kind, ddp.parameters())
    batch = make_batch(kind, batch_size)
    _steps_per_s(ddp, opt, batch, warmup)
    rate = _steps_per_s(ddp, opt, batch, steps)
    dist.destroy_process_group()
    return rate


def run_separate(args: argparse.Namespace, env: dict[str, str]) -> None:
    warmup = 10 if args.warmup is None else args.warmup
    steps = 60 if args.steps is None else args.steps
    print(
        f"separate jobs per side: {warmup} warm-up + {steps} timed steps, {args.rounds} rounds, "
        f"load {args.load}"
    )
    print(f"{'model':>9} {'hvd steps/s':>12} {'ddp steps/s':>12} {'hvd/ddp':>8} {'per round':>24}")
    sides = {"hvd": separate_hvd, "ddp": separate_ddp}
    for kind in args.models:
        rates: dict[str, list[float]] = {k: [] for k in sides}
        for r in range(args.rounds):
            for key in list(sides) if r % 2 == 0 else list(reversed(sides)):
                work = (kind, warmup, steps, args.batch_size)
                rates[key].append(hora.run(sides[key], work, np=2, env=env)[0])
        med = {k: statistics.median(v) for k, v in rates.items()}
        per_round = " ".join(
            f"{h / d:.2f}" for h, d in zip(rates["hvd"], rates["ddp"], strict=True)
        )
        print(
            f"{kind:>9} {med['hvd']:>12.1f} {med['ddp']:>12.1f} "
            f"{med['hvd'] / med['ddp']:>7.2f}x {per_round:>24}"
        )


@contextlib.contextmanager
def busy_load(n: int) -> Iterator[None]:
    """`n` processes that spin on a core each, as other work on the machine would."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", choices=["same-job", "separate"], default="same-job")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per round")
    parser.add_argument("--warmup", type=int, default=None, help="(separate) untimed steps")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--models", nargs="+", default=None)
    parser.add_argument("--load", type=int, default=0, help="busy-looping processes beside")
    parser.add_argument(
        "--no-shm",
        action="store_true",
        help="HORA_SHM=0: hora's allreduce on gloo too, as between hosts (like for like)",
    )
    args = parser.parse_args()
    env = {"HORA_SHM": "0"} if args.no_shm else {}
    with busy_load(args.load):
        if args.protocol == "separate":
            args.rounds = 3 if args.rounds is None else args.rounds
            args.models = args.models or ["mlp64x50", "mlp50"]
            run_separate(args, env)
        else:
            args.rounds = 5 if args.rounds is None else args.rounds
            args.steps = 30 if args.steps is None else args.steps
            args.models = args.models or ["mlp50", "cnn"]
            run_same_job(args, env)


def run_same_job(args: argparse.Namespace, env: dict[str, str]) -> None:
    work = (args.steps, args.rounds, args.batch_size)
    print(
        f"{'model':>6} {'hvd steps/s':>12} {'ddp steps/s':>12} {'hvd/ddp':>8} "
        f"{'no-comm steps/s':>16} {'1-proc steps/s':>15} {'scaling hvd':>12} {'scaling ddp':>12}"
    )
    for kind in args.models:
        two = hora.run(distributed, (kind, *work), np=2, env=env)[0]
        one = hora.run(single, (kind, *work), np=1)[0]
        med = {k: statistics.median(v) for k, v in {**two["rates"], **one["rates"]}.items()}
        print(
            f"{kind:>6} {med['hvd']:>12.1f} {med['ddp']:>12.1f} {med['hvd'] / med['ddp']:>7.2f}x "
            f"{med['no-comm']:>16.1f} {med['single']:>15.1f} "
            f"{2 * med['hvd'] / med['single']:>11.2f}x {2 * med['ddp'] / med['single']:>11.2f}x"
        )
        # Rounds alternate sides, so a round's ratio compares neighbours in time: its spread
        # shows how far the machine's drift moves the figure above (a loaded 2-core host: far).
        per_round = [h / d for h, d in zip(two["rates"]["hvd"], two["rates"]["ddp"], strict=True)]
        print(
            f"       (hvd/ddp per round: median {statistics.median(per_round):.2f}x, "
            f"{min(per_round):.2f}-{max(per_round):.2f}x; threads per process: "
            f"{two['threads']} on 2 ranks, {one['threads']} alone)"
        )
        print(
            "       (rank 0, ms per step in forward / backward / step(): "
            + "; ".join(
                f"{k} {' / '.join(f'{p:.2f}' for p in v)}" for k, v in two["phases"].items()
            )
            + ")"
        )


if __name__ == "__main__":
    main()
