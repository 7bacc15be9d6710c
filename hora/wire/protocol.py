"""Every message that crosses between the driver, the launchers and the workers, typed.

One module, so that a reader sees the whole conversation in one place and a sender and its
receiver cannot drift apart on a tuple's order. Messages are NamedTuples: immutable, cheap to
pickle over the channel, and matched by type (`match message: case Output(...)`), not by a string
tag. Nothing here imports more than the standard library, the channel and `hora.placement` (the
`RankPlacement` a `Reform` carries): the worker bootstrap and Spark's Python workers import it
too.

Who sends what:

- launcher -> worker process (one JSON line on its stdin): Boot
- worker -> driver (the job's channel): Hello, Heartbeat, Output, Result, Error, TimelineBatch,
  Stall, Stacks, Metrics, Resized, Resumed, InPlace, Reformed, Joining, Formed
- driver -> worker: Payload, DumpStacks, HostsUpdated, Reform
- launcher -> driver (the job's event queue): Output, Exited, EngineFailed
- rank supervisor (a Spark task, a Ray actor) <-> its launcher: TaskReady, Output, Exited /
  Go, Refuse, Stop

A rank on Spark and its task's supervisor (pyspark's TaskContext in the rank) exchange the Spark
engine's own messages, over a channel of their own (`hora.engines.spark.task_context`).
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from hora.placement import RankPlacement
from hora.wire.channel import allowed_classes

# -- launcher -> worker process -----------------------------------------------------------------


class Boot(NamedTuple):
    """What a worker process reads on stdin to find the driver and prove it belongs to the run.

    Never in the environment, which other processes of the user can read.
    """

    address: tuple[str, int]  # the job channel
    secret: bytes
    rank: int
    sys_path: tuple[str, ...] = ()  # the driver's import path, appended in the worker
    #: "module:function" the worker calls with this Boot before the job: the engine's own
    #: rank-side setup (`hora.engines.Engine.rank_setup`); "" for none
    rank_setup: str = ""

    def to_line(self) -> str:
        fields = {"address": list(self.address), "secret": self.secret.hex(), "rank": self.rank}
        fields |= {"sys_path": list(self.sys_path), "rank_setup": self.rank_setup}
        return json.dumps(fields) + "\n"

    @classmethod
    def from_line(cls, line: str) -> Boot:
        data = json.loads(line)
        host, port = data["address"]
        return cls(
            (str(host), int(port)),
            bytes.fromhex(data["secret"]),
            int(data["rank"]),
            tuple(data.get("sys_path", ())),
            str(data.get("rank_setup", "")),
        )


# -- worker -> driver ---------------------------------------------------------------------------


class Hello(NamedTuple):
    """A worker's first word: which rank it is, so the driver hands it the job."""

    rank: int
    pid: int
    host: str


class Heartbeat(NamedTuple):
    """A worker is alive and its host reachable (every few seconds while its job runs)."""

    rank: int


class Output(NamedTuple):
    """One line a rank printed ("stdout", "stderr") or sent with log_to_driver ("log")."""

    rank: int
    stream: str
    text: str


class Result(NamedTuple):
    """The rank's pickled return value (None when the driver does not want it)."""

    rank: int
    data: bytes | None


class Error(NamedTuple):
    """The rank's own account of its failure: the user's traceback, without hora's frames."""

    rank: int
    summary: str
    traceback: str
    time: float
    exception: bytes | None = None  # the exception itself, pickled, where it pickles


class TimelineBatch(NamedTuple):
    """Raw timeline events (marshalled) for the trace file at `path` on the driver."""

    rank: int
    path: str
    batch: bytes | list[Any]


class Stall(NamedTuple):
    """Rank 0's stall inspector: what has waited and for whom (None: the stall is over).

    `missing`: the ranks the stalled collectives wait for; `stopping`: the inspector is shutting
    every rank down now (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS), so the driver asks every rank
    where it is before they go."""

    text: str | None
    missing: tuple[int, ...] = ()
    stopping: bool = False


class Metrics(NamedTuple):
    """`hora.report(values, step)` from a rank: numbers (and other plain values) of one step."""

    rank: int
    step: int
    values: dict[str, Any]


#: The metric under which the driver's history and reporters carry a world re-formed in place
#: (on the first step after it); hora.report refuses it as a name of the user's.
RESIZED_METRIC = "resized"


class Stacks(NamedTuple):
    """Where a rank is: every thread's Python stack, and the collectives it has in flight."""

    rank: int
    text: str


class Resized(NamedTuple):
    """The rank stopped at commit `commit` of an elastic run because the driver asked
    (HostsUpdated): a clean end, after which the run starts again at a new size from there."""

    rank: int
    commit: int


class Resumed(NamedTuple):
    """Rank 0 of an elastic run restored the freshest commit: its index, and how many ranks
    made it."""

    rank: int
    commit: int
    size: int


class InPlace(NamedTuple):
    """The rank runs in `hvd.elastic.run`; `able`: it can re-form its world in place, so when
    another rank is lost the driver may renumber it (`Reform`) instead of stopping it, and grow
    the run without stopping it; else the run grows by a restart."""

    rank: int
    able: bool = True
    #: its state can be synced into ranks that join a larger world (hora.torch's)
    grows: bool = False


class Joining(NamedTuple):
    """A rank started to grow a running world in place has its job and waits at the new
    world's rendezvous: once every new rank says so, the driver tells the running ones to
    re-form at their next commit."""

    rank: int


class Formed(NamedTuple):
    """The rank's world of `generation` is gathered (every rank marked itself present): from
    here on a lost rank no longer leaves it waiting at the rendezvous, where the driver could
    still tell it of a smaller world."""

    rank: int
    generation: int


class Reformed(NamedTuple):
    """Rank 0 of a world re-formed in place (generation `generation`, `size` ranks) restored
    and synced the state of commit `commit`: training goes on."""

    rank: int
    generation: int
    size: int
    commit: int


# -- driver -> worker ---------------------------------------------------------------------------


class Payload(NamedTuple):
    """The pickled `(fn, args, kwargs)`; `want_result` says whether to send the value back."""

    job: bytes
    want_result: bool


class DumpStacks(NamedTuple):
    """Say where you are (a `Stacks` reply): the run timed out, stalled, or a user asked."""


class HostsUpdated(NamedTuple):
    """More slots are free for this elastic run: stop at the next commit (Horovod's
    HostsUpdatedInterrupt), so that the run grows; `generation` > 0: new ranks wait to join,
    so re-form there into that larger world (its `Reform` came first) instead of ending."""

    generation: int = 0


class Reform(NamedTuple):
    """The world changes in place (ranks were lost, or new ones wait to join it): re-form it,
    this process at `place`; `generation` counts the run's re-formed worlds (a fresh
    rendezvous prefix for each)."""

    place: RankPlacement
    generation: int


# -- launcher -> driver -------------------------------------------------------------------------


class Exited(NamedTuple):
    """A rank's process ended with `code` (negative: killed by that signal)."""

    rank: int
    code: int


class EngineFailed(NamedTuple):
    """The engine lost a rank without an exit code (a Spark task or executor lost, a stage
    failed, a task re-attempted). `subject` starts the story's headline when what failed is not
    the rank itself ("Spark task 1 on host h could not start rank 1")."""

    rank: int
    summary: str
    detail: str
    subject: str = ""


# -- a cluster engine's rank supervisor <-> its launcher (Spark's tasks) ----------------------


class TaskReady(NamedTuple):
    """A supervisor is up: which task it is (Spark's: its partition, or slot), and its host,
    GPUs, cores and (Spark's) attempt numbers."""

    task: int
    info: dict[str, Any]


class Plan(NamedTuple):
    """How every rank of an attempt starts, once each supervisor has said where it is."""

    ranks: list[dict[str, Any]]  # each rank's supervisor's report: host, gpus, cpus, ...
    master: tuple[str, int]  # the torch store the launcher hosts
    use_gpu: bool
    user_env: dict[str, str]
    cwd: str  # the driver's working folder, used where it exists
    own_gpus: bool = False  # each rank sees only its own GPUs, not those of its host's ranks


class Go(NamedTuple):
    """Every task is up: start the worker of `rank` (ranks are numbered host by host, so a
    task's rank need not be its partition) with this plan."""

    plan: Plan
    rank: int
    #: the id the driver knows the worker by, where it is not `rank` (a rank started to grow a
    #: world in place: ids are never reused, ranks are)
    ident: int | None = None


class Refuse(NamedTuple):
    """Do not start a worker (Spark re-attempted a task of a run already under way)."""

    reason: str


class Stop(NamedTuple):
    """Stop the worker and end the task."""


#: what the job's event queue carries from the launchers and the workers
DriverMessage = (
    Hello
    | Heartbeat
    | Output
    | Result
    | Error
    | TimelineBatch
    | Stall
    | Stacks
    | Metrics
    | Resized
    | Resumed
    | InPlace
    | Reformed
    | Joining
    | Formed
    | Exited
    | EngineFailed
)

#: the only classes a job channel's frame may name (hora.wire.channel's allow-list)
ALLOWED = allowed_classes(
    *(Hello, Heartbeat, Output, Result, Error, TimelineBatch, Stall, Stacks, Metrics),  # worker
    *(Resized, Resumed, InPlace, Reformed, Joining, Formed),  # worker -> driver, elastic runs
    *(Payload, DumpStacks, HostsUpdated, Reform, RankPlacement),  # driver -> worker
    *(TaskReady, Output, Exited, Plan, Go, Refuse, Stop),  # supervisor <-> launcher
)
