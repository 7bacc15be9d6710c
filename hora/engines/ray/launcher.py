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
appears) until the attempt ends, and the run grows back in place with new actors in those
bundles (`hora.job.growing`, `hora.engines.ray.slots`); otherwise hora's `max_restarts` starts
the whole group again (a new placement group), as on Spark.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from hora import engines
from hora.engines import (
    STOP_GRACE_SECONDS,
    AttemptSpec,
    Capabilities,
    EngineFailed,
    LaunchContext,
    Launcher,
    Plan,
    RanksRun,
)
from hora.engines.ray.actor import RankSupervisor
from hora.engines.ray.cluster import bundle, check_fits, connected_ray, live_nodes, one_machine
from hora.engines.ray.shipping import hora_runtime_env
from hora.engines.ray.slots import Slots

LOOPBACK = "127.0.0.1"
KILL_WAIT_SECONDS = 10.0


class RayLauncher(Launcher):
    """Starts `spec.np` ranks as actors in one placement group; checks the cluster first."""

    def __init__(self, spec: AttemptSpec):
        ray = connected_ray()
        self.spec = spec
        self.cpus, self.gpus = bundle(spec)
        self.use_gpu = self.gpus > 0 if spec.use_gpu is None else bool(spec.use_gpu)
        self.strategy = spec.options["placement_strategy"]
        if not spec.restart:  # a restart waits (up to start_timeout) for lost nodes to come back
            check_fits(ray, spec.np, self.cpus, self.gpus)
        self.node_address = ray.util.get_node_ip_address()
        # On a one-machine Ray (a laptop's ray.init(), Ray on a local Spark) hora's own traffic
        # (job channel, store, gloo) stays on loopback; on a cluster it uses the driver's node
        # address, as Ray does.
        self.one_machine = one_machine(ray, self.node_address)
        self.channel_host = LOOPBACK if self.one_machine else self.node_address
        # Other nodes cannot import the driver's own modules, and may lack hora: hora ships
        # itself as a runtime_env py_module (`engines.ships`).
        self.capabilities = Capabilities(
            ranks_run=RanksRun.ON_CLUSTER if self.one_machine else RanksRun.ELSEWHERE,
            reforms_in_place=True,  # a lost actor takes only its own rank's worker with it
            grows_in_place=True,  # new actors go in the lost ones' bundles (`slots`)
        )
        ship = engines.ships(spec.ship_code, not self.one_machine)
        self.runtime_env = hora_runtime_env() if ship else None
        self.tag = f"hora-{uuid.uuid4().hex[:12]}"
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._slots = Slots()
        self._actors: list[Any] = []  # by slot
        self._replaced: list[Any] = []  # lost actors whose slots got new ones
        self._runs: dict[Any, tuple[int, int]] = {}  # each running `run` reference -> (id, slot)
        self._ended: list[Any] = []  # the `run` references that returned or failed
        self._where: dict[int, dict[str, Any]] = {}  # id -> its actor's `where()`
        self._store: Any = None
        self._threads: list[threading.Thread] = []
        self._ctx: LaunchContext | None = None
        self._actor_class: Any = None

    def start(self, ctx: LaunchContext) -> None:
        self._ctx = ctx
        self._store, port = engines.host_store(self.channel_host)
        self._master = (self.channel_host, port)
        slots = self._new_group(self.spec.np, self.tag)
        for slot in slots:
            self._actors.append(self._actor(slot, f"{self.tag}-slot-{slot}"))
        self._thread(self._run, "hora-ray")

    def _new_group(self, bundles: int, name: str) -> list[int]:
        """A placement group of `bundles` ranks' bundles, with the launcher's strategy."""
        from ray.util.placement_group import placement_group

        bundle = {"CPU": self.cpus, "GPU": self.gpus}
        bundle = {k: v for k, v in bundle.items() if v > 0}
        group = placement_group([bundle] * bundles, strategy=self.strategy, name=name)
        return self._slots.add_group(group, bundles)

    def _actor(self, slot: int, name: str) -> Any:
        """A new actor in `slot`'s bundle (Ray starts it once the bundle is reserved)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self._actor_class is None:
            self._actor_class = connected_ray().remote(RankSupervisor)
        where = self._slots.where[slot]
        return self._actor_class.options(
            num_cpus=self.cpus,
            num_gpus=self.gpus,
            max_restarts=0,
            max_task_retries=0,
            max_concurrency=4,  # `stop` must get through while `run` waits
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self._slots.groups[where.group], placement_group_bundle_index=where.bundle
            ),
            name=name,
            runtime_env=self.runtime_env,
        ).remote(self.cpus)

    def _thread(self, target: Any, name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _run(self) -> None:
        """Wait for every actor, hand each its plan, then watch for actors that die."""
        ray = connected_ray()
        ctx = self._ctx
        assert ctx is not None
        try:
            where = self._located(ray, list(range(self.spec.np)))
            # Ranks are numbered host by host (as Horovod and torchrun do), whatever bundle
            # order the placement group chose.
            order = engines.host_order([w["host"] for w in where])
            ranks = [where[slot] for slot in order]
            plan = Plan(ranks, self._master, self.use_gpu, dict(self.spec.env), os.getcwd())
            with self._lock:
                if self._stopping.is_set():
                    return
                for rank, slot in enumerate(order):
                    self._where[rank] = where[slot]
                    run = self._actors[slot].run.remote(plan, ctx.boot(rank))
                    self._runs[run] = (rank, slot)
        except Exception as exc:
            if not self._stopping.is_set():
                ctx.report(EngineFailed(0, f"Ray could not start the ranks: {exc}", ""))
            return
        while not self._stopping.is_set():
            with self._lock:
                pending = list(self._runs)
            if not pending:  # every rank ended; a growth may add more while the attempt lasts
                self._stopping.wait(0.2)
                continue
            done, _ = ray.wait(pending, num_returns=1, timeout=0.2)
            for ref in done:
                self._ended_run(ray, ref)

    def _located(self, ray: Any, slots: list[int]) -> list[dict[str, Any]]:
        """Where the actors of `slots` are (their `where()`), hosts as hora's traffic names them."""
        where = ray.get([self._actors[slot].where.remote() for slot in slots])
        return [w | {"host": LOOPBACK} for w in where] if self.one_machine else where

    def _ended_run(self, ray: Any, ref: Any) -> None:
        """A rank's `run` returned (its worker exited) or failed (its actor died): a failure is
        the rank's, and a slot whose rank did not end cleanly may run a new one."""
        with self._lock:
            ident, slot = self._runs.pop(ref)
            self._ended.append(ref)
        try:
            code = ray.get(ref)
        except Exception as exc:
            if not self._stopping.is_set():
                with self._lock:
                    self._slots.ended(slot, actor_alive=False)
                self._lost(ident, exc)
            return
        if code != 0 and not self._stopping.is_set():
            with self._lock:
                self._slots.ended(slot, actor_alive=True)

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

    # -- growing in place -------------------------------------------------------------------
    def add(
        self, joiners: list[tuple[int, int]], running: list[int], env: Mapping[str, str]
    ) -> None:
        """New ranks in the slots of ranks that ended (a lost actor's bundle gets a new actor,
        once Ray has it reserved; a live actor whose worker died runs the new rank itself); any
        more in a placement group of their own. Their hosts are known once their actors say
        where they are: then they are paired with the joiners (`engines.joining_order`)."""
        with self._lock:
            if self._ctx is None or self._stopping.is_set():
                raise RuntimeError("the Ray launcher adds ranks only to a running attempt")
            anew, kept = self._slots.take(len(joiners))
            more = len(joiners) - len(anew) - len(kept)
            if more:
                anew += self._new_group(more, f"{self.tag}-grown-{joiners[0][0]}")
        self._thread(self._join, "hora-ray-join", joiners, running, anew, kept, dict(env))

    def _join(
        self,
        joiners: list[tuple[int, int]],
        running: list[int],
        anew: list[int],
        kept: list[int],
        env: dict[str, str],
    ) -> None:
        """Make the new actors (once their bundles are no longer on a lost node), wait for them,
        then start each joiner's worker with its place in the larger world; a failure is every
        joiner's (the attempt then fails, and restarts)."""
        ray = connected_ray()
        ctx = self._ctx
        assert ctx is not None
        slots = anew + kept
        try:
            self._wait_for_live_bundles(ray, anew)
            with self._lock:
                if self._stopping.is_set():
                    return
                for slot in anew:
                    actor = self._actor(slot, f"{self.tag}-slot-{slot}-{joiners[0][0]}")
                    if slot < len(self._actors):
                        self._replaced.append(self._actors[slot])  # the lost one: killed at stop
                        self._actors[slot] = actor
                    else:
                        self._actors.append(actor)
            where = self._located(ray, slots)
            before = [self._where[ident] for ident in running]
            order = engines.joining_order([w["host"] for w in before], [w["host"] for w in where])
            ranks = before + [where[i] for i in order]
            plan = Plan(ranks, self._master, self.use_gpu, {**self.spec.env, **env}, os.getcwd())
            with self._lock:
                if self._stopping.is_set():
                    return
                for (ident, rank), i in zip(
                    sorted(joiners, key=lambda j: j[1]), order, strict=True
                ):
                    self._where[ident] = where[i]
                    run = self._actors[slots[i]].run.remote(plan, ctx.boot(ident), rank)
                    self._runs[run] = (ident, slots[i])
        except Exception as exc:
            if not self._stopping.is_set():
                for ident, _ in joiners:
                    ctx.report(EngineFailed(ident, f"Ray could not start the rank: {exc}", ""))

    def _wait_for_live_bundles(self, ray: Any, slots: list[int]) -> None:
        """Until no bundle of `slots` is on a lost node that Ray has not yet declared dead (an
        actor placed there would die at once), or the attempt stops. Ray then reserves the
        bundle again where room is (a returning node); the driver's `start_timeout` bounds the
        wait, as it bounds any joiner's start."""
        while not self._stopping.is_set():
            live = live_nodes(ray)
            with self._lock:
                if not self._slots.stale(slots, ray.util.placement_group_table, live):
                    return
            self._stopping.wait(0.2)

    def spare(self) -> int:
        """Free slots whose bundle Ray holds reserved on a live node (`Slots.spare`)."""
        ray = connected_ray()
        with self._lock:
            if not self._slots.free or self._stopping.is_set():
                return 0
        live = live_nodes(ray)
        with self._lock:
            return self._slots.spare(ray.util.placement_group_table, live)

    def stop(self) -> None:
        self._stopping.set()
        if not self._slots.groups:
            return
        ray = connected_ray()
        with self._lock:
            runs = list(self._runs) + self._ended
            actors, groups = self._actors + self._replaced, list(self._slots.groups)
        for actor in actors:  # a lost one's among them: the others must hear it all the same
            with contextlib.suppress(Exception):
                actor.stop.remote()
        with contextlib.suppress(Exception):
            if runs:
                ray.wait(runs, num_returns=len(runs), timeout=STOP_GRACE_SECONDS + 1.0)
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        for group in groups:  # with them the lost actors' bundles, wherever Ray reserved them
            with contextlib.suppress(Exception):  # again
                ray.util.remove_placement_group(group)
        for thread in self._threads:
            thread.join(timeout=KILL_WAIT_SECONDS)
        _wait_gone(ray, actors)
        self._actors, self._replaced, self._runs, self._ended = [], [], {}, []
        self._threads = []
        self._slots = Slots()
        self._store = None


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
