"""One attempt's ranks on one engine: start them, hand on what they say, stop them all.

A group owns the job channel's server and a launcher for one attempt only; a restart builds a
new group, so every attempt gets a fresh secret, channel, rendezvous store and (on Spark) a new
barrier stage. Stale messages of a stopped attempt cannot reach the next one.
"""

from __future__ import annotations

import queue
from collections.abc import Mapping

from hora.engines import Capabilities, LaunchContext, Launcher
from hora.wire import channel
from hora.wire.protocol import ALLOWED, Heartbeat


class WorkerGroup:
    """The workers `launcher` starts (its `AttemptSpec` says how many); everything they and the
    launcher report arrives on `events` as `(connection or None, message)` pairs. `rank_setup`:
    the engine's, which every worker runs before the job. What the group says of its engine
    (`capabilities`: where its ranks run, whether they re-form or grow in place, ...) is its
    launcher's, as `hora.engines.Launcher` declares it: the driver and the monitor read it
    here."""

    def __init__(self, launcher: Launcher, rank_setup: str | None = None):
        self.launcher = launcher
        self.rank_setup = rank_setup or ""
        self.events: queue.SimpleQueue = queue.SimpleQueue()  # (C: cheap for a thousand ranks)
        self._server: channel.Server | None = None

    @property
    def capabilities(self) -> Capabilities:
        """What the attempt can do and where its ranks run (`Launcher.capabilities`)."""
        return self.launcher.capabilities

    def add(
        self, joiners: list[tuple[int, int]], running: list[int], env: Mapping[str, str]
    ) -> None:
        """Start new ranks into the running attempt, to grow it in place (`Launcher.add`)."""
        self.launcher.add(joiners, running, env)

    def spare(self) -> int:
        """Ranks the attempt could add in what it holds already (`Launcher.spare`)."""
        return self.launcher.spare()

    def slots_settled(self, held: int) -> bool:
        """Whether the engine's count is true now, with `held` ranks (`Launcher.slots_settled`)."""
        return self.launcher.slots_settled(held)

    def start(self) -> None:
        secret = channel.new_secret()
        host = self.launcher.channel_host
        # a heartbeat only says its rank is there: its connection's `heard_at` keeps that
        self._server = channel.Server(secret, self.events, ALLOWED, host, quiet=(Heartbeat,))
        address = self._server.address
        self.launcher.start(LaunchContext(address, secret, self.events, self.rank_setup))

    def stop(self) -> None:
        """Stop every worker and close the channel (a worker that outlived its supervisor sees
        the channel close and kills itself). Idempotent."""
        self.launcher.stop()
        if self._server is not None:
            self._server.close()
            self._server = None
