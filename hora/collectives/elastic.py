"""What Horovod's elastic API stands on, for every framework (`horovod.common.elastic`).

`State` is the commit protocol: `commit()` keeps the state in memory, and under a hora run also
in the host's commit store (`hora.checkpoint`), which outlives the ranks; at every commit of an
elastic run rank 0 tells the others whether the driver has said that more slots are free (one
small broadcast), so that every rank raises `HostsUpdatedInterrupt` at the same commit. `run`
is Horovod's retry loop: a collective that fails while every process lives
(`HorovodInternalError`) is healed in place (restore, `shutdown()` + `init()`, sync); a rank of
a new attempt (after a lost host, or to grow) starts by restoring the freshest commit found on
any rank's host; a `HostsUpdatedInterrupt` ends the rank cleanly at its commit, and the driver
starts the run again at the new size. Where the engine re-forms worlds in place, a lost rank's
survivors and, to grow, the running ranks with new ones become a new world in their processes.

Framework states (`hora.torch.elastic.TorchState`, `hora.tensorflow.elastic`) say how to save,
restore and sync their objects; `ObjectState` keeps plain values. A state's commits are
`_commits.Commits`'; what the rank tells the driver and hears from it, `hora.elastic`'s (through
the collectives' one hook, `_driver`).
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import os
from collections.abc import Callable, Iterable
from typing import Any, NoReturn, TypeVar

import torch

from hora.checkpoint import Commit
from hora.collectives import _driver, _reform, _rendezvous
from hora.collectives._basics import init, owns_default_group, rank, shutdown, size
from hora.collectives._commits import Commits
from hora.collectives._common import HorovodInternalError
from hora.collectives.objects import broadcast_object
from hora.wire.protocol import Reform

__all__ = ["HostsUpdatedInterrupt", "ObjectState", "State", "run"]

log = logging.getLogger(__name__)

R = TypeVar("R")
#: how many in-place resets with every process alive `run` allows before it re-raises
#: (Horovod's --reset-limit); a world re-formed after a lost rank is not counted
RESET_LIMIT_ENV = "HORA_ELASTIC_RESET_LIMIT"
DEFAULT_RESET_LIMIT = 10


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by `commit()` on every rank when the elastic run's hosts changed (Horovod's).

    Under hora, `run` turns it into a clean end of the rank: the run restarts at the new size
    from this commit; or, `in_place`, into the larger world that new ranks wait to join.
    `skip_sync` is Horovod's (hosts were only added: no need to sync).
    """

    def __init__(self, skip_sync: bool = False, in_place: bool = False):
        super().__init__("the elastic run's hosts changed")
        self.skip_sync = skip_sync
        self.in_place = in_place


class State:
    """Base: reset callbacks and the commit protocol; subclasses say how to save and sync."""

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[..., None]] = []
        self._commits = Commits()

    def register_reset_callbacks(self, callbacks: Iterable[Callable[..., None]]) -> None:
        """Run `callbacks` after each reset: in place after a failed collective, and when a
        new attempt of another size resumes. A callback that takes an argument is given the
        new world size (e.g. to rescale the learning rate); Horovod's take none."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            if _takes_an_argument(callback):
                callback(size())
            else:
                callback()

    def commit(self) -> None:
        """Save the state: in memory (a failed collective rolls back to here) and, under hora,
        on this host (a new attempt resumes from here); then check for host updates."""
        self.save()
        self._commits.write(self.committed())
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise HostsUpdatedInterrupt (on every rank alike) when the driver asked to grow."""
        word = self._commits.hosts_updated()
        if word:
            raise HostsUpdatedInterrupt(skip_sync=False, in_place=word == _driver.GROW_IN_PLACE)

    @property
    def commit_index(self) -> int:
        """How many commits the run has made, those of earlier attempts included."""
        return self._commits.index

    def restore_freshest(self) -> Commit | None:
        """Load the freshest commit of any rank's host into this state (on every rank), or
        return None when there is none."""
        commit = self._commits.freshest()
        if commit is not None:
            self.load_committed(commit.state)
        return commit

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def committed(self) -> Any:
        """The last saved state, as the commit store keeps it (plain values and tensors)."""
        raise NotImplementedError

    def load_committed(self, state: Any) -> None:
        """Make `state` (a `committed()` of some rank) the saved state, and restore it."""
        raise NotImplementedError

    def reset(self) -> None:
        """Hook for subclasses, called after re-initialisation."""

    def reforms_in_place(self) -> bool:
        """Whether a lost rank's survivors may re-form the world in place and go on from this
        state's in-memory commit (False: they restart, as for a sharded model)."""
        return True

    def reformed(self) -> None:
        """Hook: this process's world was re-formed in place; remake what belonged to the old
        one (a sharded model's mesh) before the state is restored and synced in the new one."""


def _takes_an_argument(callback: Callable[..., None]) -> bool:
    try:
        inspect.signature(callback).bind(0)
    except (TypeError, ValueError):
        return False
    return True


class ObjectState(State):
    """Plain attributes (epoch, batch, ...) kept in sync with `broadcast_object`."""

    def __init__(self, **kwargs: Any) -> None:
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__()

    def save(self) -> None:
        self._saved_state = {attr: copy.deepcopy(getattr(self, attr)) for attr in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = broadcast_object(
                self._saved_state, root_rank=0, name="elastic.ObjectState"
            )
            self._set_attrs()

    def committed(self) -> Any:
        return {"values": self._saved_state}

    def load_committed(self, state: Any) -> None:
        self._saved_state = dict(state["values"])
        self.restore()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, copy.deepcopy(value))


def run(
    func: Callable[..., R],
    reset: Callable[[], None] | None = None,
    in_place: bool = False,
    grow_in_place: bool = False,
) -> Callable[..., R]:
    """Decorate `func(state, *args, **kwargs)` to survive failures and resizes from `state`'s
    commits (Horovod's `run_fn`).

    A new attempt of a hora run first restores the freshest commit of any rank's host (else
    every rank takes rank 0's state); when that commit was made by another number of ranks,
    the reset callbacks run. On `HorovodInternalError` the state is restored, the framework is
    reset (`shutdown()` + `init()`), the reset callbacks run and `func` is called again, up to
    `HORA_ELASTIC_RESET_LIMIT` (default 10) times (a world re-formed after a lost rank is not
    counted). On `HostsUpdatedInterrupt` the rank ends cleanly at its commit and the driver
    starts the run at the new size.

    With `in_place` (hora.torch's, hora.tensorflow's), under an elastic hora run whose engine
    re-forms worlds, a lost rank stops no survivor: after `HorovodInternalError` a survivor
    waits for the driver's `Reform`, becomes a rank of the smaller world in the same process
    (`_reform.reform`, then `state.reformed()`), and goes on from the last in-memory commit,
    restored there (a sharded model's load needs every rank of the world) and synced from the
    new rank 0.
    When the run grows in place (`grow_in_place`: the same), the driver starts the new ranks
    first; at the commit where rank 0 says so (`HostsUpdatedInterrupt(in_place=True)`) the
    running ranks re-form into the larger world with them, and the new ranks, whose `run` starts
    in that world, take the running ranks' state by the same sync (their code before `run` may
    call `init()`, but no collective).
    """
    reset = reset or _reinit

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> R:
        limit = int(os.environ.get(RESET_LIMIT_ENV, DEFAULT_RESET_LIMIT))
        resets = 0
        _resume(state)
        able = in_place and state.reforms_in_place() and owns_default_group()
        reformable = _driver.announce_in_place(able, grow_in_place)
        while True:
            order: Reform | None = None
            try:
                result = func(state, *args, **kwargs)
                state._commits.finish()
            except HostsUpdatedInterrupt as interrupt:
                order, rolled_back = _grown(state, interrupt, reformable), False
            except Exception as error:
                if not _may_heal(error, reformable):
                    raise
                order, rolled_back = _after_failure(error, state, reformable), True
                resets += order is None  # a world re-formed after a lost rank is progress
                if resets > limit:
                    raise
            else:
                return result
            if order is None:
                reset()
                state.on_reset()
                state.sync()
                continue
            _go_on_in(order, state, rolled_back)

    return wrapper


def _go_on_in(order: Reform, state: State, rolled_back: bool) -> None:
    """Re-form this process's world as `order` says; there, restore the last commit (after a
    loss: a sharded model's load needs every rank of the world) and sync the state. A rank of
    that world lost before it is in sync fails its collectives here: the driver then orders a
    world without it, which this rank re-forms in turn (from the same commit)."""
    while True:
        try:
            _in_world(order, state, rolled_back)
            return
        except Exception as error:
            newer = _driver.await_reform()
            if newer is None:
                raise
            log.warning("the world re-formed as %d failed (%.120s)", order.generation, error)
            order, rolled_back = newer, True


def _may_heal(error: Exception, reformable: bool) -> bool:
    """A failed collective: Horovod's; or, where the world re-forms in place, torch.distributed's
    own (FSDP2's all-gathers, DCP's saves: a gloo pair closed by a lost peer), which a lost rank
    fails first in a sharded model's step."""
    if isinstance(error, HorovodInternalError):
        return True
    if not reformable:
        return False
    if isinstance(error, torch.distributed.DistError):
        return True
    raised = error.__traceback__
    while raised is not None and raised.tb_next is not None:
        raised = raised.tb_next
    module = raised.tb_frame.f_globals.get("__name__", "") if raised is not None else ""
    return str(module).startswith("torch.distributed")


def _after_failure(error: Exception, state: State, reformable: bool) -> Reform | None:
    """The driver's order to re-form (the state restores in the new world); else the state
    restored here, for a reset in this world (`shutdown()` + `init()`, sync). A
    torch.distributed error that no lost rank explains is the job's own: raised again."""
    order = _driver.await_reform() if reformable else None
    if order is None and not isinstance(error, HorovodInternalError):
        raise error
    log.warning(
        "collective failed (%s: %.120s); restoring the last commit",
        type(error).__name__,
        str(error).split("\n")[0],
    )
    if order is None:
        state.restore()
    return order


def _in_world(order: Reform, state: State, rolled_back: bool) -> None:
    _driver.reformed(_reform.reform(order))
    state.reformed()
    if rolled_back:
        state.restore()
    _sync_world(state)
    if rank() == 0:
        _driver.say_reformed(size(), state.commit_index)


def _reinit() -> None:
    shutdown()
    init()


def _resume(state: State) -> None:
    """A rank's start: in a world grown in place, the running ranks' state (rank 0's);
    else the freshest commit anywhere, else rank 0's state."""
    _driver.begin()  # a first world re-formed as it gathered has a generation too
    if _rendezvous.started_to_grow():
        _sync_world(state)
        return
    commit = state.restore_freshest()
    if commit is None:
        state.sync()
        return
    if rank() == 0:
        _driver.say_resumed(commit.number, commit.size)
    if commit.size != size():
        state.on_reset()


def _grown(state: State, interrupt: HostsUpdatedInterrupt, reformable: bool) -> Reform:
    """Where to re-form with the new ranks that wait to join (`interrupt.in_place`); else the
    rank ends at this commit for the driver to start the run at the new size."""
    if not _driver.attached():
        raise interrupt  # not a hora rank: nobody would start the larger run
    order = _driver.await_reform() if reformable and interrupt.in_place else None
    if order is None:
        _end_for_resize(state)
    _driver.grown(order.generation)
    return order


def _sync_world(state: State) -> None:
    """Every rank of a world re-formed in place, new ones included, takes rank 0's state: its
    commit count and `hora.report`'s step count, then (after the reset callbacks, with the new
    size) what `sync()` sends."""
    counts = (state._commits.index, _driver.steps_reported())
    state._commits.index, steps = broadcast_object(counts, 0, "elastic.world")
    _driver.set_steps_reported(steps)
    state.on_reset()
    state.sync()


def _end_for_resize(state: State) -> NoReturn:
    raise _driver.ResizeExit(state.commit_index)
