"""The Ray engine's options and its session, read without importing ray."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from typing import Any

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
OPTIONS = {
    "placement_strategy": "how the ranks' bundles are placed on nodes: PACK (default: as few "
    "nodes as possible), SPREAD, STRICT_PACK (one node) or STRICT_SPREAD (one node each)",
    "num_cpus_per_rank": "CPUs each rank's bundle reserves (default 1); also its threads",
    "num_gpus_per_rank": "GPUs each rank's bundle reserves (default 0, or 1 with use_gpu=True)",
}


def ray_is_active() -> bool:
    """Whether this program has connected to Ray (`ray.init()`); never imports ray itself."""
    if "ray" not in sys.modules:
        return False
    import ray

    return bool(ray.is_initialized())


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    strategy = str(options.get("placement_strategy", "PACK")).upper()
    if strategy not in STRATEGIES:
        raise ValueError(
            f"placement_strategy must be one of {', '.join(STRATEGIES)}, got "
            f"{options.get('placement_strategy')!r}"
        )
    checked: dict[str, Any] = {"placement_strategy": strategy}
    for name, default in (("num_cpus_per_rank", 1), ("num_gpus_per_rank", 0)):
        value = options.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        checked[name] = value
    if checked["num_cpus_per_rank"] == 0 and checked["num_gpus_per_rank"] == 0:
        raise ValueError("num_cpus_per_rank and num_gpus_per_rank cannot both be 0")
    return checked


@contextlib.contextmanager
def cli_session() -> Iterator[None]:
    """A Ray connection for `hora run --backend ray`: RAY_ADDRESS's cluster, else a local Ray
    started for the command; disconnected at the end."""
    try:
        import ray
    except ImportError:
        raise ValueError("--backend ray needs Ray: pip install 'hora[ray]'") from None
    try:
        ray.init(include_dashboard=False, log_to_driver=False)
    except Exception as exc:
        raise ValueError(f"--backend ray could not connect to Ray: {exc}") from exc
    try:
        yield
    finally:
        ray.shutdown()
