"""The negotiation at N ranks on a small machine: rank 0's real collective loop in this process,
facing N - 1 simulated ranks (tests/scale/_negotiation_ranks.py) that run hora's own tree,
relay and channel code from a few processes, on loopback TCP.

Rank 0 is `hora.collectives._control.loop.CollectiveLoop` as `init()` starts it, with one
thing left out: its data path (`run_bucket`) moves nothing, since every simulated rank's is
nothing too; what is measured is the control plane. Two measures:

- `world(...)`: a whole world running `rounds` training steps of `names` operations each, as
  fast as it can; every rank's digest of the operations it ran, in order, rank 0's CPU per step,
  the step's wall time, and faults: a simulated rank's exit (every rank stopped naming it) or a
  hung training thread (rank 0's stall inspector names it);
- `rank0_round_cost(...)`: rank 0's own work for one round with its children's frames already
  waiting on its sockets (no wake-ups, no straggler), as issue 45 measured the star: the tree
  (rank 0 hears `fanout` reports) against the star (`fanout` >= N - 1: it hears every rank).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hora.collectives._common import HorovodInternalError
from hora.collectives._control import channel, responses
from hora.collectives._control.coordinator_round import CoordinatorRound
from hora.collectives._control.loop import CollectiveLoop, LoopConfig, TreeSockets
from hora.collectives._control.negotiation import Coordinator
from hora.collectives._control.responses import ResponseHandler
from hora.collectives._control.stall import StallInspector, StallSettings
from hora.collectives._control.submissions import Op, SubmissionQueue
from hora.collectives._control.tree import NegotiationTree
from hora.collectives._data.algorithms import set_outputs
from hora.collectives._data.groups import GroupInfo
from hora.collectives._data.local_op import LocalOp
from hora.collectives._messages import ALLREDUCE, Request

ROOT = Path(__file__).resolve().parents[2]
NBYTES = 4096
FUSION = 128 * 1024 * 1024


def names(count: int = 8) -> list[str]:
    return [f"grad.{k}" for k in range(count)]


def _request(name: str) -> Request:
    return Request(name, ALLREDUCE, 0, ("float32",), ((NBYTES // 4,),), "cpu", NBYTES)


@contextlib.contextmanager
def _no_data_path(digest: Any) -> Iterator[None]:
    """Rank 0's buckets move nothing (as every simulated rank's), and are noted in order."""
    real = responses.run_bucket

    def run(bucket: Any, ops: list[LocalOp | None], info: GroupInfo) -> None:
        for entry in bucket.entries:
            digest.update(entry.name.encode() + b";")
        set_outputs(ops, [[] for _ in ops])

    responses.run_bucket = run  # type: ignore[assignment]
    try:
        yield
    finally:
        responses.run_bucket = real  # type: ignore[assignment]


class _Stalls(logging.Handler):
    """The stall inspector's lines (it logs them where no driver listens)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@dataclass
class World:
    """What a simulated world did."""

    n: int
    fanout: int
    steps: int  # completed by rank 0
    step_ms: float  # wall time of a steady step (after the first), rank 0's view
    rank0_cpu_ms: float  # rank 0's process CPU per steady step
    connect_s: float  # the tree formed: every rank connected to its parent
    agreed: bool  # every rank that completed every step ran the same operations in one order
    ended: dict[int, str | None] = field(default_factory=dict)  # why each rank stopped
    rank0_error: str | None = None
    rank0_error_at: float | None = None  # time.time()
    exited_at: float | None = None  # time.time() a simulated rank's process died
    stalls: list[str] = field(default_factory=list)
    sims_cpu_s: float = 0.0


def _blocks(n: int, procs: int) -> list[dict[str, Any]]:
    """Ranks 1 .. n-1 cut into `procs` contiguous blocks, one process each."""
    workers = n - 1
    procs = max(1, min(procs, workers))
    size, extra = divmod(workers, procs)
    blocks, first = [], 1
    for p in range(procs):
        last = first + size - 1 + (1 if p < extra else 0)
        blocks.append({"ranks": list(range(first, last + 1))})
        first = last + 1
    return blocks


def _path(tree: NegotiationTree) -> list[dict[str, Any]]:
    """The path from rank 0 down to the last rank, one process for each rank on it, and one
    for the ghosts: the other children of the path's ranks, each its whole subtree."""
    path = [tree.size - 1]
    while path[-1] != 0:
        parent = tree.parent(path[-1])
        assert parent is not None
        path.append(parent)
    on_path = set(path)
    ghosts = [c for r in path for c in tree.children(r) if c not in on_path]
    return [{"ranks": [r]} for r in reversed(path[:-1])] + [{"ranks": ghosts, "ghosts": ghosts}]


class _Group:
    """One process of simulated ranks, spoken to in JSON lines."""

    def __init__(self, config: dict[str, Any]) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.scale._negotiation_ranks"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        self.say(config)

    def say(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def hear(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"a group of simulated ranks ended (status {self.proc.wait()})")
        return dict(json.loads(line))

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.say({"close": True})
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def world(
    n: int,
    fanout: int = 8,
    steps: int = 20,
    ops: int = 8,
    procs: int = 2,
    faults: dict[str, dict[str, int]] | None = None,
    stall: StallSettings | None = None,
    seconds: float = 60.0,
    path: bool = False,
) -> World:
    """Run `steps` steps of `ops` allreduces on a simulated world of `n` ranks (rank 0 real);
    `faults`: {"exit": {rank: step}} or {"hang": {rank: step}} (see _negotiation_ranks).
    `path`: only the path to the deepest rank is live, a process per rank, and the other
    branches are ghosts on time: a step's time is then a round's way through the tree."""
    key = os.urandom(32)
    tree = NegotiationTree(n, fanout)
    config = {
        "n": n,
        "fanout": fanout,
        "key": key.hex(),
        "names": names(ops),
        "rounds": steps,
        "faults": {k: {str(r): s for r, s in v.items()} for k, v in (faults or {}).items()},
        "seconds": seconds,
    }
    shape = _path(tree) if path else _blocks(n, procs)
    groups = [_Group({**config, **part}) for part in shape]
    try:
        return _run(n, fanout, tree, key, groups, steps, ops, stall, seconds)
    finally:
        for group in groups:
            group.close()


def _run(
    n: int,
    fanout: int,
    tree: NegotiationTree,
    key: bytes,
    groups: list[_Group],
    steps: int,
    ops: int,
    stall: StallSettings | None,
    seconds: float,
) -> World:
    server, address = channel.listen("127.0.0.1")
    everywhere = {"0": address}
    for group in groups:
        everywhere.update(group.hear()["addresses"])
    began = time.monotonic()
    accepted: dict[str, Any] = {}
    accepting = threading.Thread(
        target=lambda: accepted.update(
            children=channel.accept_children(server, tree.children(0), key, seconds)
        ),
        daemon=True,
    )
    accepting.start()
    for group in groups:
        group.say({"addresses": everywhere})
    for group in groups:
        group.hear()  # connected
    accepting.join()
    connect_s = time.monotonic() - began
    digest = hashlib.blake2b(digest_size=16)
    stalls = _Stalls()
    logging.getLogger("hora.torch").addHandler(stalls)
    config = LoopConfig(0, n, 0.001, FUSION, seconds, stall or StallSettings(enabled=False))
    with _no_data_path(digest):
        loop = CollectiveLoop(
            config,
            {0: GroupInfo(ranks=tuple(range(n)), index=0)},
            TreeSockets(tree, None, accepted["children"]),
        )
        for group in groups:
            group.say({"go": True})
        try:
            done, times, cpus, error, error_at = _train(loop, steps, ops)
        finally:
            loop.stop(5.0)
            logging.getLogger("hora.torch").removeHandler(stalls)
    results = [group.hear() for group in groups]
    ranks = {int(r): v for result in results for r, v in result["ranks"].items()}
    mine = digest.hexdigest()
    steady = times[1:] or times
    return World(
        n=n,
        fanout=fanout,
        steps=done,
        step_ms=1000 * sum(steady) / max(1, len(steady)),
        rank0_cpu_ms=1000 * sum(cpus[1:] or cpus) / max(1, len(cpus[1:] or cpus)),
        connect_s=connect_s,
        agreed=all(v["digest"] == mine for v in ranks.values() if v["done"] == done == steps),
        ended={r: v["ended"] for r, v in ranks.items()},
        rank0_error=error,
        rank0_error_at=error_at,
        exited_at=next((v["exited_at"] for v in ranks.values() if v["exited_at"]), None),
        stalls=stalls.lines,
        sims_cpu_s=sum(result["cpu_s"] for result in results),
    )


def _train(
    loop: CollectiveLoop, steps: int, ops: int
) -> tuple[int, list[float], list[float], str | None, float | None]:
    """Rank 0's training loop: `ops` allreduces a step, each waited for."""
    times: list[float] = []
    cpus: list[float] = []
    for step in range(steps):
        t, c = time.perf_counter(), time.process_time()
        try:  # the loss may already be known when the step's ops are submitted
            handles = [
                loop.submit(Op(_request(name), LocalOp([], False), list), flush=k == ops - 1)
                for k, name in enumerate(names(ops))
            ]
            for handle in handles:
                loop.synchronize(handle)
        except HorovodInternalError as exc:
            return step, times, cpus, str(exc), time.time()
        times.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return steps, times, cpus, None, None


# ----- rank 0's work per round, its children's frames already waiting ---------------------------
def rank0_round_cost(n: int, fanout: int, rounds: int = 200, ops: int = 8) -> dict[str, float]:
    """Rank 0's thread CPU (ms) for one round: `cached` (a repeated step, every rank's ids),
    `first` (every rank's requests, matched by name). `fanout` >= n - 1 is the star."""
    tree = NegotiationTree(n, fanout)
    children = list(tree.children(0))
    pairs = {c: socket.socketpair() for c in children}
    try:
        first = _first_frames(tree, children, ops)
        cost_first = []
        for _ in range(3):  # a fresh rank 0 each time: nothing cached
            root = _Root(n, tree, {c: a for c, (a, _) in pairs.items()})
            cost_first.append(root.round(pairs, first, ops))
            root.close()
        root = _Root(n, tree, {c: a for c, (a, _) in pairs.items()})
        root.round(pairs, first, ops)  # every id announced
        ids = tuple(root.coordinator.cache.ids()[(0, name)] for name in names(ops))
        cached = {c: channel.pack([(c, True, 0, ids)]) for c in children}
        costs = [root.round(pairs, cached, ops) for _ in range(rounds)]
        assert root.coordinator.repeated_rounds >= rounds - 1, "not answered as repeated rounds"
        root.close()
    finally:
        for a, b in pairs.values():
            a.close()
            b.close()
    costs.sort()
    return {"cached": 1000 * costs[len(costs) // 2], "first": 1000 * min(cost_first)}


def _first_frames(tree: NegotiationTree, children: list[int], ops: int) -> dict[int, bytes]:
    """Each child's frame of a first round: every rank of its subtree's requests."""
    requests = [_request(name) for name in names(ops)]
    return {
        c: channel.pack([(r, False, 0, list(requests)) for r in tree.subtree(c)]) for c in children
    }


class _Root:
    """Rank 0's round alone, stepped by hand on sockets whose other ends the caller writes."""

    def __init__(self, n: int, tree: NegotiationTree, peers: dict[int, socket.socket]) -> None:
        self.queue = SubmissionQueue(0.0)
        self.sel = selectors.DefaultSelector()
        sets = {0: GroupInfo(ranks=tuple(range(n)), index=0)}
        self.coordinator = Coordinator(n, FUSION, 1024, tree)
        self.coordinator.set_process_set(0, sets[0].ranks)
        stall = StallInspector(StallSettings(enabled=False), self.coordinator)
        handler = ResponseHandler(self.queue, sets)
        self.step = CoordinatorRound(peers, self.sel, self.queue, handler, self.coordinator, stall)

    def round(self, pairs: dict[int, tuple[socket.socket, socket.socket]], frames, ops: int):
        for child, frame in frames.items():
            channel.send_payload(pairs[child][1], frame)
        for k, name in enumerate(names(ops)):
            self.queue.push(Op(_request(name), LocalOp([], False), list), flush=k == ops - 1)
        with _no_data_path(hashlib.blake2b()):
            began = time.thread_time()
            while self.queue.inflight:
                self.step.step([key for key, _ in self.sel.select(0)])
            spent = time.thread_time() - began
        for _, b in pairs.values():
            channel.recv_payload(b)  # rank 0's answer
        return spent

    def close(self) -> None:
        self.sel.close()
