"""A fake worker group for the driver's loop, read apart from processes: each fake attempt
replays a script of typed messages, as a launcher and workers would send them (the restart rule's
tests, the callbacks', the elastic driver's)."""

from __future__ import annotations

import queue

import cloudpickle

from hora.config import RunConfig
from hora.engines import AttemptSpec, Capabilities
from hora.job.driver import Job
from hora.wire.protocol import Error, Exited, Hello, Result


class FakeConnection:
    def __init__(self) -> None:
        self.peer = None
        self.sent: list[object] = []
        self.heard_at = 0.0  # a real channel's: when a frame last came (the monitor's own count)

    def send(self, message: object) -> None:
        self.sent.append(message)

    def close(self) -> None:
        pass


class FakeGroup:
    """Replays `script` (messages without a connection are the launcher's) when started. What
    it says of its engine is `hora.engines.Launcher`'s defaults."""

    capabilities = Capabilities()

    def spare(self) -> int:
        return 0

    def slots_settled(self, held: int) -> bool:
        return False

    def __init__(self, script: list[object], env: dict[str, str]) -> None:
        self.events: queue.Queue = queue.Queue()
        self.script = script
        self.env = env
        self.started = self.stopped = False

    def start(self) -> None:
        self.started = True
        for message in self.script:
            conn = FakeConnection() if isinstance(message, Hello) else None
            self.events.put((conn, message))

    def stop(self) -> None:
        self.stopped = True


def hellos(np: int = 2) -> list[object]:
    return [Hello(rank, 1000 + rank, "fakehost") for rank in range(np)]


def succeeds(np: int = 2) -> list[object]:
    done: list[object] = [Result(r, cloudpickle.dumps(f"value {r}")) for r in range(np)]
    return hellos(np) + done + [Exited(r, 0) for r in range(np)]


def sigkilled(rank: int) -> list[object]:
    return [*hellos(), Exited(rank, -9)]


def raises(rank: int, text: str) -> list[object]:
    return [*hellos(), Error(rank, f"ValueError: {text}", f"Traceback...\nValueError: {text}", 0.0)]


def run_scripted(
    scripts: list[list[object]], groups: list[FakeGroup] | None = None, **config
) -> tuple[list[object], list[FakeGroup]]:
    groups = [] if groups is None else groups

    def new_group(spec: AttemptSpec) -> FakeGroup:
        group = FakeGroup(scripts[spec.attempt], dict(spec.env))
        groups.append(group)
        return group

    job = Job(RunConfig(np=2, collect_all=True, **config), b"job", new_group)
    try:
        return job.run(), groups
    finally:
        assert all(g.stopped for g in groups), "every started group is stopped"
