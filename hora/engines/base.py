"""What every engine implements: start `np` workers that dial the driver, and stop them all.

A launcher gets an `AttemptSpec` (what to start) when it is built and a `LaunchContext` (where
the driver listens) when it starts; it never sees the run's `RunConfig`, which the driver's
`hora.job` turns into one spec per attempt.
"""

from __future__ import annotations

import queue
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hora import environment
from hora.engines.capabilities import Capabilities
from hora.environment.build import driver_sys_path
from hora.wire.protocol import Boot, DriverMessage


@dataclass(frozen=True)
class AttemptSpec:
    """All a launcher (and an engine's capacity count) gets of a run: one attempt's ranks."""

    #: how many ranks this attempt starts: the one source of `np` after the door
    np: int
    #: which attempt of the run (0: the first); a later one waits for lost capacity to return
    attempt: int = 0
    #: how long the launcher may wait for its slots: the run's start_timeout, never past the
    #: run's deadline (its `timeout`)
    start_timeout: float = 600.0
    #: GPU pinning: True gives every rank its GPUs, False none, None pins when the cluster
    #: gives ranks GPUs
    use_gpu: bool | None = None
    #: the engine's own options, checked and completed by its `check_options`
    options: Mapping[str, Any] = field(default_factory=dict)
    #: what every rank's environment gets beyond the contract: the driver's variables, the
    #: user's `env`, this attempt's number and the run's id
    env: Mapping[str, str] = field(default_factory=dict)
    #: the most ranks any attempt of the run may have (an elastic run's max_np; else np)
    max_np: int | None = None
    #: whether hora and the user's own modules go with the job to ranks on other machines
    #: (None: where they are needed; `hora._shipping`)
    ship_code: bool | None = None

    @property
    def restart(self) -> bool:
        """Whether an attempt came before this one."""
        return self.attempt > 0

    @property
    def most_ranks(self) -> int:
        """The most ranks any attempt of the run may have (`most_ranks`)."""
        return most_ranks(self.np, self.max_np)

    @property
    def may_reform_in_place(self) -> bool:
        """Whether this attempt's ranks may re-form their world in place: an elastic run's,
        unless HORA_ELASTIC_IN_PLACE=0 (an engine that must run its ranks differently for it,
        Spark's, asks)."""
        return environment.may_reform_in_place(self.env)


def most_ranks(np: int, max_np: int | None) -> int:
    """The most ranks any attempt of a run may have: `max_np` where the run is elastic, else
    `np`. The one place that says it (`RunConfig.most_ranks` and `AttemptSpec.most_ranks`)."""
    return max_np if max_np is not None else np


@dataclass(frozen=True)
class LaunchContext:
    """Where the driver listens for this attempt's workers, and how they prove they belong."""

    address: tuple[str, int]  # the driver's channel
    secret: bytes
    #: a launcher reports Output, Exited and EngineFailed messages here
    events: queue.SimpleQueue | queue.Queue
    #: the engine's rank-side setup ("module:function", `Engine.rank_setup`), or ""
    rank_setup: str = ""

    def boot(self, rank: int) -> Boot:
        """What a worker reads on stdin to find and authenticate to the driver; the driver's
        import path goes with it (modules it can import unpickle in the worker), and the setup
        the worker runs before the job."""
        return Boot(self.address, self.secret, rank, self.driver_sys_path, self.rank_setup)

    @property
    def driver_sys_path(self) -> tuple[str, ...]:
        """The driver's import path, as every `Boot` carries it (for a launcher that hands its
        supervisors what a Boot holds)."""
        return tuple(driver_sys_path())

    def report(self, message: DriverMessage) -> None:
        self.events.put((None, message))


class Launcher(ABC):
    """Where and how workers are started: the engine author's contract. One subclass per engine,
    built with `(spec)`, which checks the engine (cluster, slots, Python) before anything starts.

    Everything hora reads of a launcher is declared here, with the default an engine that
    says nothing gets (its `capabilities` one record); `hora.job` reads these as plain
    attributes, through its `WorkerGroup`.
    Only `start` and `stop` must be written; the rest is for engines that run elastic jobs
    in place, or ranks on other machines.
    """

    #: the interface the driver's channel listens on; workers must be able to reach it (read by
    #: `hora.job.group.WorkerGroup.start`, which opens the channel there)
    channel_host: str = "127.0.0.1"
    #: what this launcher's attempt can do and where its ranks run (`Capabilities`: every field
    #: with its default); a launcher whose answers depend on its cluster sets its own in
    #: `__init__`. hora reads it as `WorkerGroup.capabilities`.
    capabilities: Capabilities = Capabilities()

    @abstractmethod
    def start(self, ctx: LaunchContext) -> None:
        """Start the workers and return; progress arrives as events on `ctx.events` (`Output`,
        `Exited`, `EngineFailed` through `ctx.report`; the workers dial `ctx.address`
        themselves). Called once, by `WorkerGroup.start`."""

    def add(
        self, joiners: list[tuple[int, int]], running: list[int], env: Mapping[str, str]
    ) -> None:
        """Start one worker per `(id, rank)` into the started attempt, to grow it in place: `id`
        names it to the driver (its Boot's rank, never one used before), `rank` is its place in
        the larger world, after the running ranks, whose ids `running` lists in rank order.
        The engine chooses the new workers' hosts, so it gives each its placement in the larger
        world from every rank's host as the engine names it (`placement.joining_order` pairs
        the new slots with the joiners); `env` is added to the attempt's. Returns at once: a
        worker that cannot start is reported (`EngineFailed`) under its id. Called by
        `hora.job.in_place` only where `capabilities.grows_in_place`."""
        raise NotImplementedError(f"{type(self).__name__} cannot grow an attempt in place")

    def spare(self) -> int:
        """How many more ranks the started attempt could add in what it already holds, though
        the cluster's free resources do not show it (a Ray placement group's bundles whose
        actors were lost, reserved again on a live node): the growth watch of
        `hora.job.driver` adds it to the engine's count. 0 by default."""
        return 0

    def slots_settled(self, held: int) -> bool:
        """Whether the engine's count of slots is true now, while the attempt holds `held`
        ranks, though it may lag in general (not `capabilities.exact_count`): every slot its
        lost ranks held is known free, on a worker still counted and alive. The growth watch of
        `hora.job.driver` then grows back at once, without the settle time. False by default."""
        return False

    @abstractmethod
    def stop(self) -> None:
        """Stop every worker (SIGTERM, then SIGKILL) and release all resources. Idempotent:
        `WorkerGroup.stop` calls it after every attempt, also one that never started."""
