"""The Ray cluster as the Ray engine sees it: Ray's connection, the nodes that live, what a
rank's bundle reserves, and how many fit (`capacity`, by which an elastic run sizes itself)."""

from __future__ import annotations

import socket
from typing import Any

from hora.engines import AttemptSpec


def connected_ray() -> Any:
    """Ray, once the user connected to a cluster (hora never starts or joins one itself)."""
    try:
        import ray
    except ImportError:
        raise RuntimeError("backend='ray' needs Ray: pip install 'hora[ray]'") from None
    if not ray.is_initialized():
        raise RuntimeError(
            "the Ray engine (backend='ray') needs a Ray connection: call ray.init() first (a "
            "local Ray, or ray.init(address=...) for a cluster), or run on this machine with "
            "backend='local'"
        )
    return ray


def bundle(spec: AttemptSpec) -> tuple[float, float]:
    """The CPUs and GPUs each rank's bundle reserves."""
    options = spec.options
    cpus, gpus = float(options["num_cpus_per_rank"]), float(options["num_gpus_per_rank"])
    return cpus, 1.0 if spec.use_gpu and gpus == 0 else gpus


def capacity(spec: AttemptSpec, held: int) -> int:
    """How many ranks' bundles fit now: the `held` ones this job's placement group reserves,
    and as many more as the free resources of the live nodes hold. A node whose raylet no
    longer answers is not counted, though Ray declares it dead only after its health checks
    fail (seconds later): a lost host must not be counted by the attempt that replaces it."""
    ray = connected_ray()
    from ray._private.state import available_resources_per_node

    cpus, gpus = bundle(spec)
    free = available_resources_per_node()
    fits = 0
    for node in live_nodes(ray):
        have = free.get(node, {})
        fits += min(
            int(have.get(name, 0) / each + 1e-9)
            for name, each in (("CPU", cpus), ("GPU", gpus))
            if each
        )
    return held + fits


def live_nodes(ray: Any) -> set[str]:
    """The ids of the nodes Ray calls alive whose raylet answers."""
    return {n["NodeID"] for n in ray.nodes() if n.get("Alive") and _answers(n)}


def _answers(node: dict[str, Any]) -> bool:
    """Whether the node's raylet accepts a connection (a killed one refuses at once)."""
    host, port = node.get("NodeManagerAddress"), node.get("NodeManagerPort")
    if not host or not port:
        return False
    try:
        socket.create_connection((str(host), int(port)), timeout=1.0).close()
    except OSError:
        return False
    return True


def one_machine(ray: Any, address: str) -> bool:
    """Whether every live node of the cluster is this machine (the driver's node address)."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return bool(nodes) and all(n.get("NodeManagerAddress") == address for n in nodes)


def check_fits(ray: Any, np: int, cpus: float, gpus: float) -> None:
    """Refuse, before anything is placed, a job the whole cluster could never hold."""
    total = ray.cluster_resources()
    short = [
        f"{np} x {each:g} {name} = {np * each:g} {name}, the cluster has {total.get(name, 0):g}"
        for name, each in (("CPU", cpus), ("GPU", gpus))
        if each > 0 and np * each > total.get(name, 0)
    ]
    if short:
        raise ValueError(
            f"np={np} needs more than this Ray cluster has ({'; '.join(short)}): lower np, "
            "num_cpus_per_rank or num_gpus_per_rank (engine_options), or add nodes"
        )
