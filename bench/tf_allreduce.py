"""hora.tensorflow's allreduce against hora.torch's: the cost of the TF bridge, 2 ranks, same run.

Both sides use the same engine in the same hora job, alternating rounds so that load drifts hit
both: `hvd_tf.allreduce(x)` on an eager TF tensor (TF -> numpy -> torch view, no copy in; the
result copied back into a TF tensor) against `hvd_torch.allreduce(x)` on a torch tensor of the
same size (out of place on both sides, Sum). Also the same from inside a `tf.function`
(`tf.numpy_function`). Printed: seconds per call (median of rounds) and the ratio torch / TF
(1.0 = no overhead; the issue's goal is >= 0.9).

    .venv/bin/python bench/tf_allreduce.py [--sizes-mb 1 16 64] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import hora


def _calls_for(nbytes: int) -> int:
    return max(5, min(60, (128 << 20) // max(nbytes, 1)))


def _job(sizes_mb: list[float], rounds: int) -> dict[str, dict[str, list[float]]]:
    import tensorflow as tf
    import torch

    import hora.tensorflow as hvd_tf
    import hora.torch as hvd_torch

    hvd_tf.init()
    results: dict[str, dict[str, list[float]]] = {}
    for mb in sizes_mb:
        n = int(mb * (1 << 20)) // 4
        calls = _calls_for(n * 4)
        x_tf = tf.ones([n])
        x_torch = torch.ones(n)

        @tf.function
        def traced(x: tf.Tensor) -> tf.Tensor:
            return hvd_tf.allreduce(x, op=hvd_tf.Sum, name="bench.traced")

        sides: dict[str, Any] = {
            "torch": lambda x=x_torch: hvd_torch.allreduce(x, op=hvd_torch.Sum, name="b.torch"),
            "tf eager": lambda x=x_tf: hvd_tf.allreduce(x, op=hvd_tf.Sum, name="b.tf"),
            "tf.function": lambda x=x_tf, f=traced: f(x),
        }
        for fn in sides.values():  # warm up: buffers, traces, response cache
            fn()
            fn()
        times: dict[str, list[float]] = {k: [] for k in sides}
        for _ in range(rounds):
            for name, fn in sides.items():
                hvd_torch.barrier()
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                times[name].append((time.perf_counter() - start) / calls)
        results[f"{mb:g} MB"] = times
    hvd_tf.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 16, 64])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    got = hora.run(_job, args=(args.sizes_mb, args.rounds), np=2)[0]
    print(f"{'size':>7} {'torch s/call':>13} {'tf eager':>10} {'ratio':>6} "
          f"{'tf.function':>12} {'ratio':>6}")  # fmt: skip
    for size, times in got.items():
        torch_s = statistics.median(times["torch"])
        eager_s = statistics.median(times["tf eager"])
        traced_s = statistics.median(times["tf.function"])
        print(f"{size:>7} {torch_s:13.5f} {eager_s:10.5f} {torch_s / eager_s:6.2f} "
              f"{traced_s:12.5f} {torch_s / traced_s:6.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
