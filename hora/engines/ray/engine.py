"""The Ray engine's launcher: one Ray actor per rank, each in its own bundle of one placement group.

The placement group reserves every rank's CPUs (and GPUs) at once, so a job starts whole or not
at all, on nodes chosen by the strategy the user asks for (`PACK` by default, `SPREAD`, ...).
Each actor (`actor.RankSupervisor`) starts the rank's worker in a fresh Python process, exactly
as a Spark task does, so logs, results, failures, timeouts, restarts, the timeline and
hora.torch behave as on the other engines. The driver hosts the torch store and the job channel
on its Ray node's address. After every attempt (success, failure, timeout, Ctrl-C) the actors
are killed and the placement group removed: nothing is left on the cluster.

Ray's own actor restarts and task retries are off. A lost actor (its node removed, its process
killed) is reported as its rank's failure (`EngineFailed`, about 2 s after a node is killed:
Ray's wait for the actor's death); the other actors and their workers are kept. In an elastic
`hvd.elastic.run` job the survivors then re-form the world in place (`hora.job.in_place`), with
the lost actors' bundles left in the placement group (Ray reserves them again where room
appears) until the attempt ends; otherwise hora's `max_restarts` starts the whole group again
(a new placement group), as on Spark.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from typing import Any

from hora import _shipping, environment
from hora.engines.base import AttemptSpec, LaunchContext, Launcher
from hora.engines.ray.actor import RankSupervisor
from hora.engines.ray.shipping import hora_runtime_env
from hora.engines.rendezvous import host_store
from hora.engines.supervisor import STOP_GRACE_SECONDS
from hora.wire.protocol import EngineFailed, Plan

LOOPBACK = "127.0.0.1"
KILL_WAIT_SECONDS = 10.0


def _ray() -> Any:
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


class RayLauncher(Launcher):
    """Starts `spec.np` ranks as actors in one placement group; checks the cluster first."""

    multi_host = True
    reforms_in_place = True  # a lost actor takes only its own rank's worker with it

    def __init__(self, spec: AttemptSpec):
        ray = _ray()
        self.spec = spec
        self.cpus, self.gpus = _bundle(spec)
        self.use_gpu = self.gpus > 0 if spec.use_gpu is None else bool(spec.use_gpu)
        self.strategy = spec.options["placement_strategy"]
        if not spec.restart:  # a restart waits (up to start_timeout) for lost nodes to come back
            _check_capacity(ray, spec.np, self.cpus, self.gpus)
        self.node_address = ray.util.get_node_ip_address()
        # On a one-machine Ray (a laptop's ray.init(), Ray on a local Spark) hora's own traffic
        # (job channel, store, gloo) stays on loopback; on a cluster it uses the driver's node
        # address, as Ray does.
        self.one_machine = _one_machine(ray, self.node_address)
        self.channel_host = LOOPBACK if self.one_machine else self.node_address
        # Other nodes cannot import the driver's own modules, and may lack hora: hora ships
        # itself as a runtime_env py_module (hora._shipping).
        self.ranks_elsewhere = not self.one_machine
        ship = _shipping.ships(spec.ship_code, self.ranks_elsewhere)
        self.runtime_env = hora_runtime_env() if ship else None
        self.tag = f"hora-{uuid.uuid4().hex[:12]}"
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._group: Any = None
        self._actors: list[Any] = []
        self._runs: dict[Any, int] = {}  # each actor's `run` reference -> its rank
        self._store: Any = None
        self._thread: threading.Thread | None = None
        self._ctx: LaunchContext | None = None

    def start(self, ctx: LaunchContext) -> None:
        ray = _ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._ctx = ctx
        self._store, port = host_store(self.channel_host)
        self._master = (self.channel_host, port)
        bundle = {"CPU": self.cpus, "GPU": self.gpus}
        bundle = {k: v for k, v in bundle.items() if v > 0}
        self._group = placement_group(
            [bundle] * self.spec.np, strategy=self.strategy, name=self.tag
        )
        actor_class = ray.remote(RankSupervisor)
        for slot in range(self.spec.np):
            self._actors.append(
                actor_class.options(
                    num_cpus=self.cpus,
                    num_gpus=self.gpus,
                    max_restarts=0,
                    max_task_retries=0,
                    max_concurrency=4,  # `stop` must get through while `run` waits
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        self._group, placement_group_bundle_index=slot
                    ),
                    name=f"{self.tag}-slot-{slot}",
                    runtime_env=self.runtime_env,
                ).remote(self.cpus)
            )
        self._thread = threading.Thread(target=self._run, name="hora-ray", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """Wait for every actor, hand each its plan, then watch for actors that die."""
        ray = _ray()
        ctx = self._ctx
        assert ctx is not None
        try:
            where = ray.get([actor.where.remote() for actor in self._actors])
            if self.one_machine:
                where = [w | {"host": LOOPBACK} for w in where]
            # Ranks are numbered host by host (as Horovod and torchrun do), whatever bundle
            # order the placement group chose.
            order = environment.host_order([w["host"] for w in where])
            ranks = [where[slot] for slot in order]
            plan = Plan(ranks, self._master, self.use_gpu, dict(self.spec.env), os.getcwd())
            with self._lock:
                if self._stopping.is_set():
                    return
                for rank, slot in enumerate(order):
                    run = self._actors[slot].run.remote(plan, ctx.boot(rank))
                    self._runs[run] = rank
        except Exception as exc:
            if not self._stopping.is_set():
                ctx.report(EngineFailed(0, f"Ray could not start the ranks: {exc}", ""))
            return
        pending = list(self._runs)
        while pending and not self._stopping.is_set():
            done, pending = ray.wait(pending, num_returns=1, timeout=0.2)
            for ref in done:
                try:
                    ray.get(ref)
                except Exception as exc:
                    if not self._stopping.is_set():
                        self._lost(self._runs[ref], exc)

    def _lost(self, rank: int, exc: BaseException) -> None:
        """An actor died under its rank: the node was lost or its process killed."""
        assert self._ctx is not None
        text = str(exc).strip()
        self._ctx.report(
            EngineFailed(
                rank,
                "its Ray actor died before its worker exited (node lost, or actor killed)",
                text.splitlines()[0] if text else type(exc).__name__,
                f"the Ray actor of rank {rank} failed",
            )
        )

    def stop(self) -> None:
        self._stopping.set()
        if self._group is None:
            return
        ray = _ray()
        with self._lock:
            runs = list(self._runs)
        for actor in self._actors:  # a lost one's among them: the others must hear it all the same
            with contextlib.suppress(Exception):
                actor.stop.remote()
        with contextlib.suppress(Exception):
            if runs:
                ray.wait(runs, num_returns=len(runs), timeout=STOP_GRACE_SECONDS + 1.0)
        for actor in self._actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        with contextlib.suppress(Exception):  # with it the lost actors' bundles, wherever Ray
            ray.util.remove_placement_group(self._group)  # reserved them again
        if self._thread is not None:
            self._thread.join(timeout=KILL_WAIT_SECONDS)
        _wait_gone(ray, self._actors)
        self._actors, self._runs, self._group, self._thread = [], {}, None, None
        self._store = None


def _bundle(spec: AttemptSpec) -> tuple[float, float]:
    """The CPUs and GPUs each rank's bundle reserves."""
    options = spec.options
    cpus, gpus = float(options["num_cpus_per_rank"]), float(options["num_gpus_per_rank"])
    return cpus, 1.0 if spec.use_gpu and gpus == 0 else gpus


def capacity(spec: AttemptSpec, held: int) -> int:
    """How many ranks' bundles fit now: the `held` ones this job's placement group reserves,
    and as many more as the free resources of the live nodes hold. A node whose raylet no
    longer answers is not counted, though Ray declares it dead only after its health checks
    fail (seconds later): a lost host must not be counted by the attempt that replaces it."""
    ray = _ray()
    from ray._private.state import available_resources_per_node

    cpus, gpus = _bundle(spec)
    free = available_resources_per_node()
    fits = 0
    for node in ray.nodes():
        if not node.get("Alive") or not _answers(node):
            continue
        have = free.get(node["NodeID"], {})
        fits += min(
            int(have.get(name, 0) / each + 1e-9)
            for name, each in (("CPU", cpus), ("GPU", gpus))
            if each
        )
    return held + fits


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


def _wait_gone(ray: Any, actors: list[Any]) -> None:
    """Until Ray reports every actor dead: their processes (and GPUs) are free for what's next."""
    ids = {actor._actor_id.hex() for actor in actors}
    deadline = time.monotonic() + KILL_WAIT_SECONDS
    while ids and time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            states = ray._private.state.actors()
            ids = {i for i in ids if states.get(i, {}).get("State") not in ("DEAD", None)}
        if ids:
            time.sleep(0.05)


def _one_machine(ray: Any, address: str) -> bool:
    """Whether every live node of the cluster is this machine (the driver's node address)."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return bool(nodes) and all(n.get("NodeManagerAddress") == address for n in nodes)


def _check_capacity(ray: Any, np: int, cpus: float, gpus: float) -> None:
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
