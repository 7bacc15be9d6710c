"""What hora reads of an engine besides starting and stopping ranks, declared once.

Where the ranks run is one answer (`RanksRun`), not three flags: it says whether log lines name
each rank's host, whether a script need exist only here, and whether the user's modules go by
value with the job. An engine's declaration (`Engine.ranks_run`) says it before any launcher is
built; a launcher's `Capabilities` say it, and what else its attempt can do, for that attempt.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class RanksRun(enum.Enum):
    """Where an engine's ranks run."""

    #: processes of this machine, the driver's children (the local engine): hosts go unnamed,
    #: a script need exist only here, and the ranks import the driver's modules
    HERE = "here"
    #: in a cluster's workers (Spark tasks, Ray actors), which may be on this machine too: log
    #: lines and failure stories name each rank's host; the ranks import the driver's modules
    ON_CLUSTER = "on a cluster"
    #: on machines (or a Spark Connect server) that cannot import the driver's modules: the
    #: user's own modules then go by value with the job, as `ship_code` allows; hora itself is
    #: the engine's to ship (`hora.engines.hora_zip`, `rank_pythonpath`)
    ELSEWHERE = "elsewhere"


@dataclass(frozen=True)
class Capabilities:
    """What one launcher's attempt can do, with the defaults a launcher that says nothing gets.
    hora reads it in one place, `WorkerGroup.capabilities`."""

    #: where this attempt's ranks run (read by `hora.job.launch`, before the job is pickled, and
    #: by `hora.job.monitor` and `hora.job.driver` for the hosts)
    ranks_run: RanksRun = RanksRun.HERE
    #: whether a lost rank may leave the others running, to re-form in place (an elastic run's
    #: `hvd.elastic.run`): the launcher then keeps the survivors' processes and rendezvous store
    #: (read by `hora.job.driver`, which then lets the monitor re-form the world)
    reforms_in_place: bool = False
    #: whether `Launcher.add` can start ranks into the running attempt, to grow it in place
    #: (read by `hora.job.driver` and `hora.job.monitor`)
    grows_in_place: bool = False
    #: whether the engine's count of free slots is true at once (no lost host's executors still
    #: counted, no replacement yet to register): an elastic run then waits no settle time
    #: before it grows back or sizes its next attempt, unless HORA_ELASTIC_SETTLE_SECONDS says
    #: (read by `hora.job.driver`)
    exact_count: bool = False

    @property
    def names_hosts(self) -> bool:
        """Whether log lines name the host as well as the rank, and a failure story the lost
        host: wherever the ranks are not all the driver's children."""
        return self.ranks_run is not RanksRun.HERE
