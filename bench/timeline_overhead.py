"""Timeline overhead: training steps per second with the timeline recording and without.

One 2-rank job (hora.run, `HOROVOD_TIMELINE=DYNAMIC`) trains the train-step benchmark's model with
`hvd.DistributedOptimizer`; rounds alternate recording on (`hvd.start_timeline`) and off, the
order flipping every round, so drift hits both sides alike. The driver writes the trace while the
ranks train, as it does in real runs. Overhead = 1 - median over rounds of (on / off).

    .venv/bin/python bench/timeline_overhead.py [--steps 40] [--rounds 8]
        [--models mlp50 cnn mlp50-per-tensor]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import train_step  # the model, batch and step loop of bench/train_step.py

import hora

PER_TENSOR = "-per-tensor"


class PerTensorAllreduce:
    """The worst case for a timeline: one named allreduce per gradient, ~10 events each."""

    def __init__(self, opt: Any, named: list[tuple[str, Any]]) -> None:
        self.opt, self.named = opt, named

    def zero_grad(self) -> None:
        self.opt.zero_grad()

    def step(self) -> None:
        import hora.torch as hvd

        handles = [hvd.allreduce_async_(p.grad, name=n) for n, p in self.named]
        for h in handles:
            hvd.synchronize(h)
        self.opt.step()


def alternate(
    kind: str, steps: int, rounds: int, batch_size: int, path: str, noise_floor: bool = False
) -> dict[str, Any]:
    import torch

    import hora.torch as hvd

    hvd.init()
    per_tensor = kind.endswith(PER_TENSOR)
    kind = kind.removesuffix(PER_TENSOR)
    model = train_step.make_model(kind)
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if per_tensor:
        opt: Any = PerTensorAllreduce(sgd, list(model.named_parameters()))
    else:
        opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    batch = train_step.make_batch(kind, batch_size)
    train_step._steps_per_s(model, opt, batch, 5)  # warm-up
    rates: dict[str, list[float]] = {"on": [], "off": [], "on_cpu": [], "off_cpu": []}
    for r in range(rounds):
        for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
            hvd.barrier()
            if mode == "on" and not noise_floor:
                hvd.start_timeline(path)
            cpu = time.process_time()  # all of this rank's threads: recorder and flusher too
            rates[mode].append(train_step._steps_per_s(model, opt, batch, steps))
            rates[mode + "_cpu"].append((time.process_time() - cpu) / steps)
            if mode == "on" and not noise_floor:
                hvd.stop_timeline()
    hvd.shutdown()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument(
        "--noise-floor",
        action="store_true",
        help="never start the timeline: both sides are 'off', the overhead shown is noise",
    )
    parser.add_argument(
        "--models",
        nargs="+",
        default=["mlp50", "cnn", "mlp50" + PER_TENSOR],
        help=f"train_step models; '<model>{PER_TENSOR}' allreduces each gradient on its own",
    )
    args = parser.parse_args()
    os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"
    for kind in args.models:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            work = (kind, args.steps, args.rounds, args.batch_size, path, args.noise_floor)
            driver_cpu = time.process_time()
            per_rank = hora.run(alternate, work, np=2)
            driver_cpu = time.process_time() - driver_cpu  # mostly formatting the trace
            size = os.path.getsize(path) if os.path.exists(path) else 0
        # Collectives keep the ranks in step: average the two ranks' rate of each round.
        rates = {
            mode: [statistics.mean(r) for r in zip(*(p[mode] for p in per_rank), strict=True)]
            for mode in ("on", "off", "on_cpu", "off_cpu")
        }
        cpu = statistics.median(
            a / b for a, b in zip(rates["on_cpu"], rates["off_cpu"], strict=True)
        )
        on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
        # Rounds next to each other see the same load: the median of per-round ratios is the
        # figure least moved by what else runs on the machine.
        paired = statistics.median(a / b for a, b in zip(rates["on"], rates["off"], strict=True))
        for mode in ("on", "off"):
            shown = " ".join(f"{x:.1f}" for x in rates[mode])
            print(f"{kind}: steps/s per round, timeline {mode:<3}: {shown}")
        print(
            f"{kind}: median on {on:.1f}, off {off:.1f} steps/s; overhead (median of per-round "
            f"ratios) {100 * (1 - paired):+.1f}%; trace {size / 1e6:.1f} MB for "
            f"{args.rounds * args.steps} recorded steps"
        )
        print(
            f"{kind}: rank CPU per step {1e3 * statistics.median(rates['off_cpu']):.2f} ms off, "
            f"{100 * (cpu - 1):+.1f}% on; driver CPU for the whole job {driver_cpu:.2f} s"
        )


if __name__ == "__main__":
    main()
