"""The job's world on the driver: which processes are its ranks, and how it changes in place.

The membership's part of an elastic attempt's decisions (after torch elastic's `WorkerState`
and Ray Train v2's controller, whose states return scaling and failure decisions): the ranks by
process, their hosts, the world's generation, the new ranks on their way in, and its phase, in
the attempt's one enum (`hora.job.state.AttemptState`). The attempt's ear and controller
(`hora.job.hearing`, `hora.job.attempt`) tell it what happened (a rank started, said whether
its `hvd.elastic.run` can re-form in place, was lost, waits to join, a world re-formed) and
its hands (`hora.job.in_place.Hands`) carry out what it decides: re-form a world
(`ReformWorld`), start new ranks (`StartJoiners`), drop the ranks of a growth given up
(`Abandon`), or end the attempt so that every rank restarts (`Restart`). It does no I/O and
reads no clock of its own, so every event can be tried in every state (tests/job).

A process is named by its id (its first rank; a new rank's id is never one used before), its
rank is its place in `members`. Survivors keep their process and their order: a world re-formed
after a loss numbers them 0..n-1 in the order they had; new ranks come after the running ones.

A running rank lost during a growth, leaving fewer than `min_np` survivors where the survivors
and the new ranks are `min_np` or more, re-forms the survivors with the new ranks from the
survivors' last commit (as a shrink would, the new ranks in it): at once where every new rank
said hello (its host known), else once one waits at the rendezvous and every host is known.

What stays a restart of every rank (docs/elastic.md): fewer than `min_np` survivors (with the
new ranks of a growth under way, where a running rank was lost); a rank lost past the first
world's rendezvous before every survivor said it can re-form (a survivor whose `hvd.elastic.run`
has not started may be inside torch's rendezvous or hora's start-up, which cannot hear the
driver, or in the user's own code before `run`, which no commit covers); a rank that
failed with its own exception (it would fail again) or is only silent (it may live on).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from hora.job.state import AttemptState


class ReformWorld(NamedTuple):
    """Tell each of `members` (ids, in rank order) its place in the world of `generation`;
    `grow`: the running ones (`running`) re-form at their next commit, with new ranks that wait
    (the driver also says `HostsUpdated(generation)`). `before`: the world's size before it
    (a process keeps its id: its new rank is its place in `members`)."""

    generation: int
    members: tuple[int, ...]
    hosts: tuple[str, ...]
    grow: bool
    running: tuple[int, ...]
    before: int
    why: str


class StartJoiners(NamedTuple):
    """Start one new rank per `(id, rank)` into the world of `generation`; `running`: the
    running ranks' ids in rank order (the engine places the new ones beside them)."""

    joiners: tuple[tuple[int, int], ...]
    running: tuple[int, ...]
    generation: int
    why: str


class Abandon(NamedTuple):
    """Close the channels of these ids (new ranks of a growth given up: each kills itself);
    their ranks (`ranks`, as numbered before) leave the monitor's records, which keep the
    `running` ranks."""

    ids: tuple[int, ...]
    ranks: tuple[int, ...]
    running: int
    why: str


class Restart(NamedTuple):
    """The attempt cannot go on in place: it fails, and the driver restarts every rank."""

    why: str


Decision = ReformWorld | StartJoiners | Abandon | Restart


@dataclass
class Loss:
    """A lost rank as the monitor saw it: `gone` (its process ended, or what ran it), and
    `own` (it failed with its job's own exception: it would fail again)."""

    rank: int
    gone: bool
    own: bool = False


@dataclass
class World:
    """One attempt's membership."""

    np: int
    #: the fewest ranks a world re-formed in place may have
    min_np: int
    #: whether the world may re-form in place at all (an elastic run on an engine whose ranks
    #: can): False, a lost rank restarts the attempt and the world never grows in place
    in_place: bool
    members: list[int] = field(default_factory=list)  # ids in rank order
    hosts: dict[int, str] = field(default_factory=dict)  # id -> host (its Hello)
    able: set[int] = field(default_factory=set)  # ids whose hvd.elastic.run can re-form
    cannot: set[int] = field(default_factory=set)  # ... and those whose run said it cannot
    no_growth: set[int] = field(default_factory=set)  # ids whose state cannot grow in place
    generation: int = 0
    joiners: list[int] = field(default_factory=list)  # new ranks' ids, after the members
    waiting: set[int] = field(default_factory=set)  # joiners not at the rendezvous yet
    deadline: float = 0.0  # when the waiting joiners are given up (the caller's clock)
    grew_at: float = 0.0  # when the growth under way started (the caller's wall clock)
    joined_at: float = 0.0  # ... and when its last new rank waited (0: not yet, or a shrink)
    gone: set[int] = field(default_factory=set)  # ids lost or abandoned: never a rank again
    formed: set[int] = field(default_factory=set)  # ids whose world of `generation` gathered
    #: how long a world ordered may take to say it goes on before the attempt restarts
    confirm_wait: float = float("inf")
    phase: AttemptState = AttemptState.STARTING
    #: the world ordered and not yet confirmed by its rank 0: (generation, before, why, since)
    pending: tuple[int, int, str, float] | None = None
    next_id: int = 0
    #: a running rank lost during a growth left too few survivors: they re-form with the new
    #: ranks once every new one said hello: (the running world's size before, why, since)
    regroup: tuple[int, str, float] | None = None
    #: id -> rank now, for `rank_of` on every message (rebuilt when members or joiners change)
    _ranks: dict[int, int] = field(default_factory=dict, repr=False, compare=False)
    _indexed: tuple[Any, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        self.members = self.members or list(range(self.np))
        self.next_id = max(self.next_id, self.np)

    # -- who is who ---------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return len(self.members)

    def rank_of(self, pid: int) -> int | None:
        """The rank now of process `pid` (a joiner's after the members); None once gone."""
        if pid in self.gone:
            return None
        members, joiners = self.members, self.joiners
        now = (members, joiners, len(members), len(joiners))  # the lists held: no reused id
        held = self._indexed
        if (
            len(held) != 4
            or held[0] is not members
            or held[1] is not joiners
            or held[2:] != now[2:]
        ):
            self._ranks = {m: r for r, m in enumerate(members)}
            for i, j in enumerate(joiners):
                self._ranks.setdefault(j, len(members) + i)
            self._indexed = now
        return self._ranks.get(pid)

    def id_of(self, rank: int) -> int:
        """The process that is rank `rank` now."""
        everyone = self.members + [j for j in self.joiners if j not in self.members]
        return everyone[rank]

    # -- events -------------------------------------------------------------------------------
    def started(self, pid: int, host: str) -> int | None:
        """Process `pid` said hello from `host`: its rank, or None (unknown, gone: close it)."""
        rank = self.rank_of(pid)
        if rank is not None:
            self.hosts[pid] = host
        return rank

    def said(self, pid: int, able: bool, grows: bool) -> None:
        """Process `pid`'s hvd.elastic.run started and said whether it can re-form in place."""
        (self.able if able else self.cannot).add(pid)
        if not grows:
            self.no_growth.add(pid)
        if self.phase is AttemptState.STARTING and all(
            m in self.able | self.cannot for m in self.members
        ):
            self.phase = AttemptState.RUNNING

    def gathered(self, pid: int, generation: int) -> None:
        """Process `pid`'s world of `generation` gathered: past its rendezvous, a rank lost no
        longer leaves it waiting where the driver's word reaches it."""
        if generation == self.generation:
            self.formed.add(pid)

    def grow(
        self, size: int, can_add: bool, now: float, wait: float, wall: float = 0.0
    ) -> StartJoiners | None:
        """The cluster has room for `size` ranks: start new ones when every running rank can
        re-form and grow in place (`can_add`: the engine can add ranks); None: grow by a
        restart instead, or not now."""
        if not (
            self.phase is AttemptState.RUNNING
            and can_add
            and self.in_place
            and size > self.size
            and all(m in self.able and m not in self.no_growth for m in self.members)
        ):
            return None
        self.generation += 1
        ids = list(range(self.next_id, self.next_id + size - self.size))
        self.next_id += len(ids)
        self.joiners, self.waiting = ids, set(ids)
        self.deadline, self.grew_at, self.joined_at = now + wait, wall, 0.0
        self.phase = AttemptState.GROWING
        joiners = tuple((pid, self.size + i) for i, pid in enumerate(ids))
        why = f"free slots for {size} ranks"
        return StartJoiners(joiners, tuple(self.members), self.generation, why)

    def joined(self, pid: int, now: float) -> ReformWorld | None:
        """New rank `pid` waits at the larger world's rendezvous; once all do, every running
        rank is told its place and to re-form at its next commit."""
        if pid not in self.waiting or self.pending is not None:
            return None
        self.waiting.discard(pid)
        if self.regroup is not None:
            return self._regroup_now() if self._joiners_known() else None
        if self.waiting:
            return None
        before = self.size
        running = tuple(self.members)
        self.members = self.members + self.joiners
        self.able |= set(self.joiners)  # the running ranks' own code, started where they could
        self.joined_at = now
        why = f"free slots for {self.size} ranks"
        self.pending = (self.generation, before, why, self.grew_at)
        return self._order(True, running, before, why)

    def reformed(self, generation: int) -> tuple[int, str, float] | None:
        """Rank 0 of the world of `generation` says training goes on: (the size before, why,
        since when), or None for a world given up since."""
        if self.pending is None or generation != self.pending[0]:
            return None
        _, before, why, since = self.pending
        if not self.joiners:
            self.joined_at = 0.0
        self.pending = None
        self.joiners, self.waiting = [], set()
        self.phase = AttemptState.RUNNING
        return before, why, since

    def late(self, now: float, wall: float = 0.0) -> Abandon | Restart | None:
        """New ranks that did not reach the rendezvous in time: the growth is given up (the
        running ranks never heard of it); a later one may start others. A world ordered that
        did not go on within `confirm_wait` (a rank stuck in a rendezvous with a lost one):
        the attempt restarts."""
        if self.pending is not None and wall - self.pending[3] > self.confirm_wait:
            self.phase = AttemptState.FAILING
            return Restart(
                f"the world re-formed in place as generation {self.pending[0]} did not go on "
                f"within {self.confirm_wait:g} s (start_timeout)"
            )
        if not self.waiting or self.pending is not None or now < self.deadline:
            return None
        if self.regroup is not None:  # without them, fewer than min_np survivors
            late = "new ranks did not reach the rendezvous in time"
            return self._restart(f"{late}; {self.regroup[1]}")
        return self._abandon("new ranks did not reach the rendezvous in time")

    def lose(self, losses: list[Loss], now: float, why: str) -> list[Decision]:
        """Ranks (numbered now) were lost. Any loss gives up a growth under way (its new ranks
        are dropped; the running ones re-form without them if they were told of it); a running
        rank lost shrinks the world in place when the rest can, else the attempt restarts."""
        lost = {self.id_of(loss.rank): loss for loss in losses}
        if self.regroup is not None:  # the survivors already wait for the new ranks
            return [self._restart(why)]
        if self._may_regroup(lost):
            order = self._regroup(lost, now, why)
            return [order] if order is not None else []
        told = self.pending is not None and bool(self.joiners)  # the running ranks heard of it
        decisions: list[Decision] = []
        if self.joiners:
            decisions.append(self._abandon(f"lost during the growth: {why}"))
        running_lost = [loss for pid, loss in lost.items() if pid in self.members]
        survivors = [m for m in self.members if m not in lost]
        if self.phase is AttemptState.STARTING and self._may_gather(losses, survivors):
            return [self._gather_fewer(survivors, why)]
        if running_lost and not self._may_shrink(running_lost, survivors):
            return [*decisions, self._restart(why)]
        if running_lost or told:  # told: the running ranks re-form, without the new ones
            decisions.append(self._shrink(survivors, now, why))
        return decisions

    def stop(self) -> None:
        """The attempt is over: nothing more is decided."""
        self.phase = AttemptState.STOPPING

    # -- the decisions ------------------------------------------------------------------------
    def _restart(self, why: str) -> Restart:
        self.phase = AttemptState.FAILING
        return Restart(why)

    def _may_gather(self, losses: list[Loss], survivors: list[int]) -> bool:
        """While the first world gathers: no rank is past its rendezvous (every survivor still
        waits there, or has yet to reach it, and will hear of the smaller world), every lost
        rank is gone, and at least min_np are left."""
        return (
            self.in_place
            and not self.formed & set(self.members)  # the lost ranks are members still
            and len(survivors) >= self.min_np
            and all(loss.gone and not loss.own for loss in losses)
        )

    def _gather_fewer(self, survivors: list[int], why: str) -> ReformWorld:
        """The survivors of a rank lost as the world gathers gather a smaller one instead (in
        their rendezvous); it is still starting: each says when its run can re-form."""
        order = self._shrink(survivors, 0.0, why)
        self.pending, self.phase, self.formed = None, AttemptState.STARTING, set()
        return order

    def _may_shrink(self, running_lost: list[Loss], survivors: list[int]) -> bool:
        """Every lost running rank is gone without a word of its own, and at least min_np
        survivors run in an hvd.elastic.run that can re-form. (While the world starts, a
        survivor that has not said so may be in its own code before `run`, which no commit
        covers; one that said so is in its loop: `run` says it once it resumed.)"""
        return (
            self.in_place
            and len(survivors) >= self.min_np
            and all(loss.gone and not loss.own for loss in running_lost)
            and all(m in self.able for m in survivors)
        )

    def _may_regroup(self, lost: dict[int, Loss]) -> bool:
        """A growth under way, only running ranks lost (gone, without a word of their own), too
        few survivors to shrink to, and survivors that can re-form: with the new ranks they are
        `min_np` or more."""
        running = [m for m in self.members if m not in self.joiners]
        survivors = [m for m in running if m not in lost]
        return (
            self.in_place
            and bool(self.joiners)
            and all(pid in running and loss.gone and not loss.own for pid, loss in lost.items())
            and 0 < len(survivors) < self.min_np <= len(survivors) + len(self.joiners)
            and all(m in self.able for m in survivors)
        )

    def _regroup(self, lost: dict[int, Loss], now: float, why: str) -> ReformWorld | None:
        """The survivors of running ranks lost during a growth, with its new ranks: ordered now
        where every new rank said hello (their hosts place every rank), else once one waits
        (`joined`); the survivors wait for the order in their `hvd.elastic.run`."""
        running = [m for m in self.members if m not in self.joiners]
        self.gone |= set(lost)
        self.members = [m for m in running if m not in lost]
        why = f"{why}; the survivors re-form with the new ranks"
        self.pending, self.regroup = None, (len(running), why, now)
        return self._regroup_now() if self._joiners_known() else None

    def _joiners_known(self) -> bool:
        return all(j in self.hosts for j in self.joiners)

    def _regroup_now(self) -> ReformWorld:
        """Every rank, the new ones included, re-forms now, from the survivors' last commit."""
        assert self.regroup is not None
        before, why, since = self.regroup
        self.members = self.members + self.joiners
        self.able |= set(self.joiners)  # the running ranks' own code, started where they could
        self.joiners, self.waiting, self.regroup = [], set(), None
        self.joined_at = 0.0
        self.generation += 1
        self.pending = (self.generation, before, why, since)
        self.phase = AttemptState.SHRINKING
        return self._order(False, tuple(self.members), before, why)

    def _shrink(self, survivors: list[int], now: float, why: str) -> ReformWorld:
        before = self.size
        self.gone |= set(self.members) - set(survivors)
        self.members = survivors
        self.generation += 1
        self.pending = (self.generation, before, why, now)
        self.phase = AttemptState.SHRINKING
        return self._order(False, tuple(survivors), before, why)

    def _abandon(self, why: str) -> Abandon:
        """Give up the growth under way: its new ranks leave (after the running ones' ranks,
        whether or not the members already counted them)."""
        running = [m for m in self.members if m not in self.joiners]
        ranks = tuple(range(len(running), len(running) + len(self.joiners)))
        ids = tuple(self.joiners)
        self.members = running
        self.gone |= set(ids)
        self.joiners, self.waiting, self.pending = [], set(), None
        self.phase = AttemptState.RUNNING
        return Abandon(ids, ranks, len(running), why)

    def _order(self, grow: bool, running: tuple[int, ...], before: int, why: str) -> ReformWorld:
        hosts = tuple(self.hosts.get(m, "") for m in self.members)
        return ReformWorld(self.generation, tuple(self.members), hosts, grow, running, before, why)
