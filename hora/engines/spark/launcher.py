"""The Spark engine's launcher: one barrier stage of `np` tasks, one rank per task.

Each task is a supervisor (`task.supervise`) that starts the worker in a fresh Python process;
the workers then talk to the driver's job channel as local workers do. This launcher is the
supervisors' side on the driver: it hosts the torch store (no rank races for a port), acts as
the rendezvous (every task reports its host and GPUs, then each gets the plan; Spark's own
`allGather` costs a second per call), relays output and exit codes, and stops everything: first
by telling the supervisors, then by cancelling the stage by its tag. The stage itself is the
session's (`base.Session`): an RDD barrier stage on a classic session, a barrier `mapInArrow`
on a Spark Connect one; the rest is the same for both.

Each task first runs `entry` (shipped by value), which refuses to start a rank on a Python
unlike the driver's, or where it cannot reach the driver (on a local or local-cluster master a
classic session's tasks get the driver's interpreter: `checks.python_for_tasks`). A failed
stage is reported as the task that failed and why (`failures`), never as a rank that did not
run. A rank is started at most once per run: a re-attempted task or stage is refused and the
job fails, rather than re-running a half-finished training behind the user's back.

An elastic run (classic session) runs each rank's task as a Spark job of its own instead
(`Session.run_alone`), all under the run's tag: a barrier stage fails as a whole (Spark kills
every task of it when one is lost), so the survivors could not re-form in place
(`hora.job.in_place`). What that trades: Spark's all-or-nothing start of a barrier stage (the
rendezvous still starts no rank before every task is up, and the slot check still runs first),
BarrierTaskContext's `barrier`/`allGather` in the ranks (they say so), and one line in the
Spark UI (one job per rank). A lost task's re-attempt is refused quietly (its loss was reported
when its first channel closed). A rank that fails under its live task ends that task at once:
its slot is then free for a rank that grows the world back, which Spark would otherwise queue.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from functools import partial
from typing import Any

from hora import engines
from hora.engines import (
    ALLOWED,
    STOP_GRACE_SECONDS,
    AttemptSpec,
    Capabilities,
    Connection,
    EngineFailed,
    Exited,
    Go,
    LaunchContext,
    Launcher,
    Output,
    Plan,
    RanksRun,
    Refuse,
    Server,
    Stop,
    TaskReady,
)
from hora.engines.spark import capacity as _capacity
from hora.engines.spark import checks as _spark_checks
from hora.engines.spark import entry as _spark_entry
from hora.engines.spark import failures as _spark_failures
from hora.engines.spark import shipping as _spark_shipping
from hora.engines.spark.options import task_gpu_counts
from hora.engines.spark.session import active_session
from hora.engines.spark.task import TaskSpec
from hora.engines.spark.task_ranks import TaskRanks

CANCEL_WAIT_SECONDS = 5.0


class SparkLauncher(Launcher):
    """Starts `spec.np` ranks as one barrier stage; checks the cluster first."""

    def __init__(self, spec: AttemptSpec):
        session = active_session()
        if session is None:
            raise RuntimeError(
                "the Spark engine (np > 0, backend='spark') needs an active SparkSession (classic "
                "or Spark Connect): create one first (SparkSession.builder...getOrCreate()), or "
                "run on this machine with Runner(np=-N) / backend='local'"
            )
        session.check()
        options = spec.options
        resource = options["gpu_resource"]
        _spark_checks.check_ssl(session, options["ignore_ssl_key"])
        _spark_checks.check_dynamic_allocation(session)
        self.use_gpu = _spark_checks.resolve_use_gpu(session, spec.use_gpu, resource)
        self.gpu_resource = resource if self.use_gpu else None
        self.gpu_counts = task_gpu_counts(options["task_gpu_counts"], spec.np)
        self.python = _spark_checks.python_for_tasks(session)
        # On other machines the ranks cannot import the driver's own modules; a Python that
        # Spark chooses may lack hora: hora ships itself then (`engines.ships`).
        elsewhere = session.kind == "connect" or not (
            _spark_checks.runs_on_this_machine(session.master)
        )
        if engines.ships(spec.ship_code, self.python is None):
            _spark_shipping.ship_hora(session)
        # executors still registering, or a lost one being replaced: waited for, saying so
        slots = _spark_checks.check_slots(session, spec.np, spec.start_timeout, resource)
        if slots is None and not spec.restart:
            print(_spark_checks.uncounted_slots(spec.np, spec.start_timeout), file=sys.stderr)
        self.session = session
        # A lost task of a barrier stage takes every other task down: an elastic run's ranks
        # are jobs of their own, so the survivors can re-form in place (a Connect client has
        # no elastic runs: it cannot count slots).
        in_place = session.kind == "classic" and spec.may_reform_in_place
        self.capabilities = Capabilities(
            ranks_run=RanksRun.ELSEWHERE if elsewhere else RanksRun.ON_CLUSTER,
            reforms_in_place=in_place,
            grows_in_place=in_place,  # a task more is a job more
        )
        self.channel_host = session.channel_host()
        self.tag = f"hora-{uuid.uuid4().hex[:12]}"
        self._np = spec.np
        self._user_env = dict(spec.env)
        self._lock = threading.Lock()
        self._ranks_of_tasks = TaskRanks()  # every task's report, to number the ranks they run
        self._tasks = self._ranks_of_tasks.tasks  # by Spark task (partition, or slot)
        self._rank_of: dict[int, int] = {}  # Spark task -> the rank the driver knows it by
        self._slots = spec.np  # tasks started so far, ranks added to grow in place included
        self._joining: tuple[list[tuple[int, int]], list[int], dict[str, str]] | None = None
        self._joining_slots: list[int] = []
        self._supervisors: dict[int, Connection] = {}
        self._exited: set[int] = set()
        self._tally = _capacity.TaskTally()  # an elastic run's tasks: is Spark's count true?
        self._planned = False  # every task has registered and been told to start its rank
        self._stopping = threading.Event()
        self._inbox: queue.Queue = queue.Queue()
        self._server: Server | None = None
        self._store: Any = None
        self._threads: list[threading.Thread] = []
        self._ctx: LaunchContext | None = None
        self._task_spec: TaskSpec | None = None

    # -- start ------------------------------------------------------------------------------
    def start(self, ctx: LaunchContext) -> None:
        self._ctx = ctx
        self._store, port = engines.host_store(self.channel_host)
        self._master = (self.channel_host, port)
        self._server = Server(ctx.secret, self._inbox, ALLOWED, host=self.channel_host)
        spec = TaskSpec(
            address=self._server.address,
            worker_address=ctx.address,
            secret=ctx.secret,
            sys_path=ctx.driver_sys_path,
            gpu_resource=self.gpu_resource,
            rank_setup=ctx.rank_setup,
        )
        relay = threading.Thread(target=self._relay, name="hora-spark-relay", daemon=True)
        relay.start()
        self._threads = [relay]
        self._task_spec = spec  # what a rank added to grow the attempt gets too
        if not self.capabilities.reforms_in_place:
            self._start_thread(partial(self._run_stage, spec), "hora-spark-stage")
            return
        for slot in range(self._np):
            self._start_alone(spec, slot)

    def _start_thread(self, target: Any, name: str) -> None:
        thread = self.session.thread(target, name=name)
        thread.daemon = True
        thread.start()
        self._threads.append(thread)

    def _run_stage(self, spec: TaskSpec) -> None:
        driver = _spark_entry.runtime()
        try:
            self.session.run_barrier(self._np, driver, dataclasses.asdict(spec), self.tag)
        except Exception as exc:
            if not self._stopping.is_set():
                self._report_stage_failure(self._read(exc, driver))

    def _start_alone(self, spec: TaskSpec, slot: int) -> None:
        self._tally.started(slot)
        self._start_thread(partial(self._run_alone, spec, slot), f"hora-spark-rank-{slot}")

    def _run_alone(self, spec: TaskSpec, slot: int) -> None:
        """One rank's task as a Spark job of its own; its failure is its rank's alone."""
        driver = _spark_entry.runtime()
        spec = dataclasses.replace(spec, slot=slot)
        description = f"hora: rank slot {slot} of an elastic run ({self.tag})"
        try:
            self.session.run_alone(driver, dataclasses.asdict(spec), self.tag, description)
        except Exception as exc:
            self._tally.ended(slot, failed=True)
            if not self._stopping.is_set():  # Spark names partition 0 of the job: the slot's
                self._report_stage_failure(dataclasses.replace(self._read(exc, driver), task=slot))
        else:
            self._tally.ended(slot)

    def slots_settled(self, held: int) -> bool:
        """Whether Spark's count is true now (`capacity.TaskTally` says when)."""
        return self._tally.settled(held)

    def _read(self, exc: Exception, driver: dict[str, str]) -> _spark_failures.StageFailure:
        connect = self.session.kind == "connect"
        return _spark_failures.read(
            exc, driver, self.session.master, self.python is not None, connect=connect
        )

    def _report_stage_failure(self, failure: _spark_failures.StageFailure) -> None:
        """Name the task that failed, and whether its rank had been started at all."""
        task = failure.task
        if task is None or not 0 <= task < self._slots:
            rank = self._first_running_rank()
            who = "the Spark stage failed"
            self._report(EngineFailed(rank, failure.summary, failure.detail, who))
            return
        rank = self._rank_of.get(task, task)  # before the plan, a task's rank is not yet chosen
        host = failure.host or self._tasks.get(task, {}).get("host")
        where = f"Spark task {task}" + (f" on host {host}" if host else "")
        if self._planned and not failure.before_start:
            who = f"{where} (rank {rank}) failed"
        else:
            who = f"{where} could not start rank {rank}"
        self._report(EngineFailed(rank, failure.summary, failure.detail, who))

    # -- the supervisors' messages ----------------------------------------------------------
    def _relay(self) -> None:
        while True:
            conn, message = self._inbox.get()
            if conn is None and message is None:
                return
            if message is None:
                self._closed(conn)
                continue
            if isinstance(message, TaskReady):
                self._register(conn, message.task, message.info)
            elif isinstance(message, Output | Exited) and conn.peer == message.rank:
                if isinstance(message, Exited):
                    self._exited.add(message.rank)
                    self._release(conn, message.code)
                self._report(message)

    def _release(self, conn: Connection, code: int) -> None:
        """A rank of an elastic run failed under its live task (its worker killed, crashed):
        the task ends now, not with the attempt, so that its slot is free for a rank started
        to grow the world back (Spark would queue that task behind it)."""
        if self.capabilities.reforms_in_place and code != 0 and not self._stopping.is_set():
            with contextlib.suppress(OSError):
                conn.send(Stop())

    def _register(self, conn: Connection, task: int, info: dict[str, Any]) -> None:
        if not (isinstance(task, int) and 0 <= task < self._slots):
            conn.close()
            return
        if task in self._tasks or self._stopping.is_set():
            # Spark re-attempted a task or the whole stage: never train the same rank twice.
            # an elastic run's lost rank's task: its loss is reported already
            if self.capabilities.reforms_in_place:
                self._tally.retried()
                with contextlib.suppress(OSError):
                    conn.send(Refuse("its rank was lost; the others went on without it"))
                return
            rank = self._rank_of.get(task, task)
            reason = (
                f"Spark started task {task} (rank {rank}) a second time (task attempt "
                f"{info.get('attempt')}, stage {info.get('stage')}) after a failure; hora does "
                "not re-run a half-finished training. Fix the first failure and run again."
            )
            with contextlib.suppress(OSError):
                conn.send(Refuse(reason))
            if not self._stopping.is_set():
                self._report(EngineFailed(rank, "Spark re-attempted the task", reason))
            return
        with self._lock:
            self._tasks[task] = info
            self._supervisors[task] = conn
            ready = not self._planned and all(t in self._tasks for t in range(self._np))
            joined = self._joining is not None and all(
                t in self._tasks for t in self._joining_slots
            )
        if ready:
            self._start_ranks()
        elif joined:
            self._start_joiners()

    def _start_ranks(self) -> None:
        """Every task is up: number the ranks host by host (as Horovod and torchrun do) and
        tell each task its rank and the plan."""
        ranks, order = self._ranks_of_tasks.start(list(range(self._np)), self.gpu_counts)
        self._rank_of = {task: rank for rank, task in enumerate(order)}
        self._planned = True
        plan = Plan(
            ranks=ranks,
            master=self._master,
            use_gpu=self.use_gpu,
            user_env=self._user_env,
            cwd=os.getcwd(),
            own_gpus=self.gpu_counts is not None,
        )
        for rank, task in enumerate(order):
            conn = self._supervisors[task]
            conn.peer = rank
            with contextlib.suppress(OSError):
                conn.send(Go(plan, rank))

    # -- growing in place ---------------------------------------------------------------------
    def add(
        self, joiners: list[tuple[int, int]], running: list[int], env: Mapping[str, str]
    ) -> None:
        """Start one task per `(id, rank)` as a job of its own; once all are up, each gets its
        place in the larger world (its host is Spark's choice, known only then)."""
        if self._task_spec is None or not self.capabilities.reforms_in_place:
            raise RuntimeError("the Spark launcher adds ranks only to a started elastic attempt")
        with self._lock:
            first = self._slots
            self._slots += len(joiners)
            self._joining_slots = list(range(first, self._slots))
            self._joining = (list(joiners), [self._slot_of(i) for i in running], dict(env))
            # until their hosts are known, a failure of a task is that of some new rank
            self._rank_of.update(zip(self._joining_slots, (i for i, _ in joiners), strict=True))
        for slot in self._joining_slots:
            self._start_alone(self._task_spec, slot)

    def _start_joiners(self) -> None:
        """Every added task is up: place them after the running ranks and start their ranks."""
        with self._lock:
            assert self._joining is not None
            joiners, running, env = self._joining
            slots, self._joining = self._joining_slots, None
            ranks, added = self._ranks_of_tasks.grow(running, slots)
        plan = Plan(
            ranks=ranks,
            master=self._master,
            use_gpu=self.use_gpu,
            user_env={**self._user_env, **env},
            cwd=os.getcwd(),
        )
        for (ident, rank), slot in zip(sorted(joiners, key=lambda j: j[1]), added, strict=True):
            self._rank_of[slot] = ident
            conn = self._supervisors[slot]
            conn.peer = ident
            with contextlib.suppress(OSError):
                conn.send(Go(plan, rank, ident))

    def _closed(self, conn: Connection) -> None:
        rank = conn.peer
        if rank is None or rank in self._exited or self._stopping.is_set():
            return
        if not self._planned:  # no rank started: another task failed, and the stage says which
            return
        task = self._slot_of(rank)
        host = self._tasks.get(task, {}).get("host")
        several = len({info.get("host") for info in self._tasks.values()}) > 1
        why = "its Spark task ended before its worker exited (executor lost, or task killed)"
        who = f"rank {rank} failed on host {host}" if host and several else ""
        self._report(EngineFailed(rank, why, "", who))

    def _slot_of(self, rank: int) -> int:
        """The task of the rank the driver knows as `rank`."""
        return next((t for t, r in self._rank_of.items() if r == rank), rank)

    def _report(self, message: EngineFailed | Output | Exited) -> None:
        if self._ctx is not None:
            self._ctx.report(message)

    def _first_running_rank(self) -> int:
        return next((r for r in range(self._np) if r not in self._exited), 0)

    # -- stop -------------------------------------------------------------------------------
    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            supervisors = list(self._supervisors.values())
            everyone_started = len(self._tasks) == self._slots
        for conn in supervisors:
            with contextlib.suppress(OSError):
                conn.send(Stop())
        jobs = self._threads[1:]
        if jobs:
            if everyone_started:
                _join_all(jobs, STOP_GRACE_SECONDS + 1.0)
            if any(job.is_alive() for job in jobs):  # tasks waiting for slots, or stuck
                with contextlib.suppress(Exception):
                    self.session.cancel(self.tag)
                _join_all(jobs, CANCEL_WAIT_SECONDS)
        if self._server is not None:
            self._server.close()
        self._inbox.put((None, None))
        for thread in self._threads[:1]:
            thread.join(timeout=5)
        self._threads = []
        self._store = None


def _join_all(threads: list[threading.Thread], seconds: float) -> None:
    """Join `threads`, all of them within `seconds` together."""
    deadline = time.monotonic() + seconds
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
