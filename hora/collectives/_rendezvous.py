"""torch.distributed's default group for a hora world: the attempt's first by `env://`, a world
re-formed in place through the launcher's same store under a prefix of its own.

Every world re-formed in place has a generation (the driver counts them, `Reform`); its keys
live under `hora/reform/<generation>/`, so no key of an older world is read again. A rank started
to grow a running world (it has the generation in its environment) says so to the driver
(`Joining`) and waits for the world to open: the running ranks open it when they reach the
commit where they re-form, which may be a while (one commit interval), longer than the group's
own timeout should be. Where a running rank is lost meanwhile and its survivors re-form with the
new ranks (`hora.job.world`), the driver's newer word ends that wait.

Before the group itself is made, every rank of a re-formed world marks itself present and waits
for all the others: a rank lost meanwhile would leave torch's rendezvous waiting for ever, so a
rank that hears the driver's newer word (a world without the lost rank) re-forms that one
instead (`Superseded`). The barrier costs each rank the same few store operations whatever the
world's size: one counter (`store.add`), one blocking wait for the key the last rank to arrive
sets, one read of it; the first rank to hear of a newer world sets that key too, from its
channel's thread, and every rank blocked in the wait goes on at once. Past the barrier, torch's
own rendezvous (gloo's) waits on the store for every rank's address: there the store the group
is made with gives way to the driver's newer word too (`_Released`), so the survivors of a rank
lost in that window re-form without it at once, not after gloo's timeout.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from hora import environment
from hora.collectives import _driver
from hora.environment import RankEnvironment
from hora.environment.build import placement_env
from hora.wire.protocol import Reform

OPEN_KEY = "open"  # set by the running ranks of a world re-formed in place as they join it
#: how long a new rank waits for the running ones to reach their commit; the driver stops it
#: sooner when the attempt ends without them
JOIN_WAIT = timedelta(days=1)
PRESENT_KEY = "present"  # how many ranks of the world marked themselves present (store.add)
#: "all" once the last rank arrived; "superseded" once a rank heard of a newer world first
GATHERED_KEY = "gathered"
ALL, SUPERSEDED = "all", "superseded"
#: how often torch's rendezvous, waiting for a rank's key, looks for the driver's newer word
PRESENT_POLL_SECONDS = 0.02


class Superseded(Exception):
    """The driver ordered a newer world (`order`) while this one was still forming."""

    def __init__(self, order: Reform) -> None:
        super().__init__(f"world {order.generation} ordered while an older one formed")
        self.order = order


def raise_if_superseded(generation: int, wait_s: float = 0.0) -> None:
    """Raise `Superseded` where the driver has ordered a world newer than `generation`, waiting
    up to `wait_s` for its word."""
    newer = _driver.wait_reform(generation, wait_s)
    if newer is not None:
        raise Superseded(newer)


# gloo connects every pair of a group's ranks when the group is made (a full mesh: N - 1
# connections and 2N + 1 store operations a rank, N^2 at the store), unless its pairs connect on
# first use (`TORCH_GLOO_LAZY_INIT`: one store operation a rank, and a few more for the peers a
# collective touches). Measured (bench/gloo_init.py, docs/scale.md), the mesh costs little below
# a few dozen ranks and grows with N^2 above, while a lazy pair costs the first collective a
# connection: worlds this large or larger connect lazily, unless the variable says otherwise.
LAZY_GLOO_VAR = "TORCH_GLOO_LAZY_INIT"
LAZY_GLOO_FROM = 32
_lazy_chosen = False  # whether hora set LAZY_GLOO_VAR (a value the user set is theirs)


def choose_gloo_connect(size: int) -> None:
    """How gloo connects the groups of the world of `size` ranks about to be made: on first use
    from LAZY_GLOO_FROM ranks. Every rank of a world decides by that world's size, a running rank
    re-forming into a world of another size as well as the new ranks it meets there: ranks of
    one group that connect at once and on first use crash each other (SIGSEGV in gloo's
    connectFullMesh). A value the user set is left alone (the same on every rank)."""
    global _lazy_chosen
    if LAZY_GLOO_VAR in os.environ and not _lazy_chosen:
        return
    _lazy_chosen = size >= LAZY_GLOO_FROM
    if _lazy_chosen:
        os.environ[LAZY_GLOO_VAR] = "1"  # read by every gloo group made from now on
    else:
        os.environ.pop(LAZY_GLOO_VAR, None)


def default_transports() -> str:
    """The default group's transports (torch.distributed's `backend`): gloo for CPU tensors,
    and NCCL for CUDA ones where there is a GPU."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


_started_to_grow = False  # this process started as a new rank of a world grown in place


def started_to_grow() -> bool:
    """Whether this process started as a new rank of a running world grown in place (it takes
    the running ranks' state, not a commit)."""
    return _started_to_grow


def init_default_group(here: RankEnvironment, wait: timedelta, opening: bool = False) -> None:
    """Make this process rank `here.rank` of the default group of its world: by env:// for the
    attempt's first world; else through the store under the world's prefix, where `opening`
    (a running rank re-forming) lets the waiting new ranks in, and a new rank waits for that.
    Where the driver orders a newer world while this one gathers (a rank of it was lost), that
    world, as its place there says."""
    global _started_to_grow
    _started_to_grow = _started_to_grow or bool(here.generation and not opening)
    while True:
        try:
            _make_default_group(here, wait, opening)
            return
        except Superseded as newer:
            here, opening = take(newer.order), True


def take(order: Reform) -> RankEnvironment:
    """Write the place `order` gives this process, and its world's generation, where `init()`
    and the user's code read them."""
    os.environ.update(placement_env(order.place))
    os.environ[environment.GENERATION_VAR] = str(order.generation)
    return environment.current()


def _make_default_group(here: RankEnvironment, wait: timedelta, opening: bool) -> None:
    rank, size = here.rank, here.size
    assert rank is not None and size is not None
    choose_gloo_connect(size)  # this world's, whatever this process's last world was
    if not here.generation:
        if _first_world_may_re_form(here):  # lost ranks' survivors may still hear of a smaller
            _all_present(_store(here, 0, wait), rank, size, 0, wait, _waker(here, 0))
        _driver.say_formed(0)
        dist.init_process_group(
            default_transports(), init_method="env://", rank=rank, world_size=size
        )
        return
    store = _store(here, here.generation, wait)
    if opening:
        store.set(OPEN_KEY, "1")
    else:
        _driver.say_joining()
        _wait_open(store, here)
    _all_present(store, rank, size, here.generation, wait, _waker(here, here.generation))
    _driver.say_formed(here.generation)
    global _group_store
    _group_store = _Released(store, here.generation, wait)  # (its Python half must outlive it)
    dist.init_process_group(
        default_transports(), store=_group_store, rank=rank, world_size=size, timeout=wait
    )


def _wait_open(store: dist.Store, here: RankEnvironment) -> None:
    """A new rank waits for the running ranks to open its world; where the driver orders a
    newer world first (a running rank was lost: its survivors re-form with the new ranks),
    that one (`Superseded`): the order opens this world from the channel's thread, so the wait
    ends at once."""
    generation = here.generation

    def newer_ordered(order: Reform) -> None:
        if order.generation > generation:
            _store(here, generation, timedelta(seconds=WAKE_SECONDS)).set(OPEN_KEY, "1")

    with _driver.watching_reforms(newer_ordered):
        raise_if_superseded(generation)
        store.wait([OPEN_KEY], JOIN_WAIT)
    raise_if_superseded(generation)


def _first_world_may_re_form(here: RankEnvironment) -> bool:
    """An elastic hora run's first world, with the launcher's store and in place allowed."""
    allowed = os.environ.get(environment.IN_PLACE_VAR, "1") != "0"
    return here.elastic and allowed and bool(here.master_addr) and here.master_port is not None


def _store(here: RankEnvironment, generation: int, wait: timedelta) -> dist.Store:
    """The launcher's store, under the prefix of the world of `generation`."""
    addr, port = here.master_addr, here.master_port
    if not addr or port is None:
        raise RuntimeError("a world re-formed in place needs the launcher's MASTER_ADDR/PORT")
    client = dist.TCPStore(addr, port, is_master=False, timeout=wait)
    return dist.PrefixStore(f"hora/reform/{generation}/", client)


def _waker(here: RankEnvironment, generation: int) -> Callable[[], None]:
    """What says, on a store client of its own (the rank's own is blocked in the barrier's
    wait), that the world of `generation` will never gather: a newer one was ordered."""

    def wake() -> None:
        store = _store(here, generation, timedelta(seconds=WAKE_SECONDS))
        store.compare_set(GATHERED_KEY, "", SUPERSEDED)

    return wake


WAKE_SECONDS = 10.0


def _all_present(
    store: dist.Store,
    rank: int,
    size: int,
    generation: int,
    wait: timedelta,
    wake: Callable[[], None] | None = None,
) -> None:
    """Mark this rank present and wait until every rank of the world is; raise `Superseded`
    when the driver orders a newer world meanwhile (a rank of this one was lost). `wake` says
    so to every rank waiting here, from the channel's thread (None: this rank learns it only
    when the wait ends)."""

    def newer_ordered(order: Reform) -> None:
        if order.generation > generation and wake is not None:
            wake()

    began = time.monotonic()
    with _driver.watching_reforms(newer_ordered):
        raise_if_superseded(generation)
        if store.add(PRESENT_KEY, 1) >= size:  # the last to arrive
            store.compare_set(GATHERED_KEY, "", ALL)
        try:
            store.wait([GATHERED_KEY], wait)
            gathered = store.get(GATHERED_KEY) == ALL.encode()
        except dist.DistStoreError:
            gathered = False
    if gathered:
        return
    left = max(0.0, wait.total_seconds() - (time.monotonic() - began))
    raise_if_superseded(generation, left)
    raise RuntimeError(
        f"the world re-formed in place as generation {generation} did not gather its "
        f"{size} ranks within {wait.total_seconds():g} s"
    )


#: the store of the default group made last: torch holds it from C++, where a store written in
#: Python loses its methods once Python holds it no more ("Not implemented" in new_group)
_group_store: _Released | None = None


class _Released(dist.Store):
    """The store a re-formed world's group is made with: `wait` and `get` give way to the
    driver's newer word (`Superseded`, raised through torch's rendezvous) while a key is
    missing, polling the store every PRESENT_POLL_SECONDS only then; the rest goes through."""

    def __init__(self, store: dist.Store, generation: int, timeout: timedelta) -> None:
        super().__init__()
        self._store = store
        self._generation = generation
        self._timeout = timeout

    def _until_set(self, keys: list[str], timeout: timedelta | None) -> None:
        limit = (timeout or self._timeout).total_seconds()
        deadline = time.monotonic() + limit
        while not self._store.check(keys):
            if not _driver.attached():  # no driver to hear from (a test's own process)
                time.sleep(PRESENT_POLL_SECONDS)
            else:
                raise_if_superseded(self._generation, PRESENT_POLL_SECONDS)
            if time.monotonic() > deadline:
                raise dist.DistStoreError(f"wait timeout after {limit:g} s, keys: {keys}")

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._until_set(keys, timeout)

    def get(self, key: str) -> bytes:
        self._until_set([key], None)
        return self._store.get(key)

    def set(self, key: str, value: str) -> None:
        self._store.set(key, value)

    def add(self, key: str, value: int) -> int:
        return self._store.add(key, value)

    def check(self, keys: list[str]) -> bool:
        return self._store.check(keys)

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        return self._store.compare_set(key, expected, desired)

    def delete_key(self, key: str) -> bool:
        return self._store.delete_key(key)

    def num_keys(self) -> int:
        return self._store.num_keys()

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = timeout
        self._store.set_timeout(timeout)

    def append(self, key: str, value: str) -> None:
        self._store.append(key, value)  # type: ignore[attr-defined]  # (not in torch's stub)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self._until_set(keys, None)
        return self._store.multi_get(keys)

    def multi_set(self, keys: list[str], values: list[str]) -> None:
        self._store.multi_set(keys, values)  # type: ignore[attr-defined]  # (not in torch's stub)

    def has_extended_api(self) -> bool:
        return bool(self._store.has_extended_api())  # type: ignore[attr-defined]  # (as above)
