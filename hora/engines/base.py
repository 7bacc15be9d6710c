"""What every engine implements: start `np` workers that dial the driver, and stop them all."""

from __future__ import annotations

import queue
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

from hora import environment
from hora.wire.protocol import Boot, DriverMessage


@dataclass(frozen=True)
class LaunchContext:
    """What a launcher needs from the driver to start workers."""

    np: int
    address: tuple[str, int]  # the driver's channel
    secret: bytes
    events: queue.Queue  # a launcher reports Output, Exited and EngineFailed messages here
    env: Mapping[str, str]

    def boot(self, rank: int) -> Boot:
        """What a worker reads on stdin to find and authenticate to the driver; the driver's
        import path goes with it (modules it can import unpickle in the worker)."""
        return Boot(self.address, self.secret, rank, tuple(environment.driver_sys_path()))

    def report(self, message: DriverMessage) -> None:
        self.events.put((None, message))


class Launcher(ABC):
    """Where and how workers are started. One subclass per engine."""

    #: the interface the driver's channel listens on; workers must be able to reach it
    channel_host: str = "127.0.0.1"
    #: whether log lines should name the host as well as the rank
    multi_host: bool = False

    @abstractmethod
    def start(self, ctx: LaunchContext) -> None:
        """Start the workers and return; progress arrives as events on `ctx.events`."""

    @abstractmethod
    def stop(self) -> None:
        """Stop every worker (SIGTERM, then SIGKILL) and release all resources. Idempotent."""
