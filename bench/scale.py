"""hora's control plane at N ranks on a small machine: the negotiation and the driver, simulated
around hora's real code (tests/scale), the tree beside the star it replaced.

The negotiation (tests/scale/_negotiation_sim.py): rank 0's real collective loop, its data path
moving nothing, facing N - 1 simulated ranks that run hora's own tree, relay and channel code
from a few processes without torch, on loopback TCP. A step is 8 allreduces of 4 KB, repeated
(cached after the first). Measured, each at fanout 8 (the default) and as the star (fanout
N - 1: every rank a child of rank 0, the shape before issue 45):

- `rank0_cpu_ms_per_cached_round`: rank 0's thread CPU for one cached round, its children's
  frames already waiting on its sockets (no wake-ups, no straggler: issue 45's own method);
  `rank0_cpu_ms_first_round`: the same for a first, uncached round (every rank's requests);
- `round_latency_ms`: a step's time when only the path from rank 0 to the deepest rank is live,
  a process per rank on it, and the other branches are on time (each a ghost for its subtree):
  the way of a round up and down the tree with a wake-up at every hop, as a world whose ranks
  each have a core of their own would see it;
- `round_wall_ms_sim`, `rank0_cpu_ms_live`: the whole world live, N - 1 simulated ranks sharing
  this machine's cores with rank 0 (so the step's wall time is mostly the simulation's own CPU),
  and rank 0's process CPU per step there.

The driver (tests/scale/_driver_sim.py, `measure_driver`): `driver_cpu_percent`, `ready_s`,
`store_ops_per_rank`, `detect_exit_s`, `detect_hang_s` (from the silence to the verdict; the
simulation's heartbeat timeout is `hang_timeout_s`), `reform_s`.

    .venv/bin/python bench/scale.py [--sizes 16 64 256 1024] [--json] [--no-driver]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.scale import _driver_sim, _negotiation_sim

FANOUT = 8


def negotiation(n: int, rounds: int, steps: int) -> dict[str, float]:
    tree = _negotiation_sim.rank0_round_cost(n, FANOUT, rounds)
    star = _negotiation_sim.rank0_round_cost(n, max(2, n - 1), rounds)
    path = _negotiation_sim.world(n, FANOUT, steps=steps, path=True)
    live = _negotiation_sim.world(n, FANOUT, steps=max(5, steps // 4))
    if not (path.agreed and live.agreed):
        raise RuntimeError(f"n={n}: the simulated ranks did not all run the same steps")
    return {
        "rank0_cpu_ms_per_cached_round": tree["cached"],
        "rank0_cpu_ms_per_cached_round_star": star["cached"],
        "rank0_cpu_ms_first_round": tree["first"],
        "rank0_cpu_ms_first_round_star": star["first"],
        "round_latency_ms": path.step_ms,
        "depth": float(_negotiation_sim.NegotiationTree(n, FANOUT).depth()),
        "round_wall_ms_sim": live.step_ms,
        "rank0_cpu_ms_live": live.rank0_cpu_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--rounds", type=int, default=200, help="cached rounds timed at rank 0")
    parser.add_argument("--steps", type=int, default=60, help="steps of the live simulations")
    parser.add_argument("--json", action="store_true", help="one JSON line per N")
    parser.add_argument("--no-driver", action="store_true", help="the negotiation only")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    rows = []
    for n in args.sizes:
        began = time.monotonic()
        row: dict[str, float] = {"n": float(n), **negotiation(n, args.rounds, args.steps)}
        if not args.no_driver:
            row.update(_driver_sim.measure_driver(n))
        row["seconds"] = time.monotonic() - began
        rows.append(row)
        if args.json:
            print(json.dumps({k: round(v, 4) for k, v in row.items()}), flush=True)
        else:
            _print_row(row)
    if not args.json:
        print(f"(1-minute load average at the start: {load:.1f}; {os.cpu_count()} cores)")


def _print_row(row: dict[str, float]) -> None:
    n = int(row["n"])
    print(
        f"N={n:5d}  rank 0 per cached round {row['rank0_cpu_ms_per_cached_round']:.3f} ms "
        f"(star {row['rank0_cpu_ms_per_cached_round_star']:.3f} ms, "
        f"{row['rank0_cpu_ms_per_cached_round_star'] / row['rank0_cpu_ms_per_cached_round']:.1f}x)"
        f"  first round {row['rank0_cpu_ms_first_round']:.2f} ms "
        f"(star {row['rank0_cpu_ms_first_round_star']:.2f})"
        f"  latency {row['round_latency_ms']:.2f} ms over {int(row['depth'])} levels"
        f"  live: step {row['round_wall_ms_sim']:.1f} ms, rank 0 {row['rank0_cpu_ms_live']:.2f} ms",
        flush=True,
    )
    if "driver_cpu_percent" in row:
        print(
            f"         driver {row['driver_cpu_percent']:.1f}% of a core, "
            f"ready {row['ready_s']:.2f} s, store ops/rank {row['store_ops_per_rank']:.1f}, "
            f"exit seen {row['detect_exit_s']:.2f} s, "
            f"hang seen {row['detect_hang_s']:.2f} s after the silence, "
            f"re-form {row['reform_s']:.2f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
