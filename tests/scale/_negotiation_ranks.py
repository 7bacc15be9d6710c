"""Many simulated ranks of the negotiation tree in one process, without torch:
`python -m tests.scale._negotiation_ranks`, one per group of ranks (tests/scale/_negotiation_sim.py
starts them).

Each simulated rank runs hora's own code for its share of the control plane: the tree
(`_control.tree`), the relay that folds its subtree's cached rounds (`_control.relay`), the
channel's framing, handshake and restricted unpickling (`_control.channel`), on real loopback
TCP sockets to its parent and children; it submits a round of operations (requests the first
time, cache ids once rank 0 has announced them), passes rank 0's answer down before it reads it,
and notes every operation it was told to run, in order. Its data path is nothing: the work here
is the control plane. One selector serves every socket of the process.

`hora.collectives` imports torch at its front door; the control modules used here do not, so the
package is stood in for by a bare one before they are imported (a fresh interpreter, this
module's `main` only).

Lines on stdin and stdout are JSON: the config; this process's parents' addresses; everyone's
parents' addresses; "connected"; "go"; the results. Faults in the config: `exit` (a rank's
process dies at the start of a round: its sockets close) and `hang` (a rank's training thread
stops submitting at a round; its loop still relays, as a hung user thread's does). A "ghost"
rank stands for its whole subtree without its children (its reports are its subtree's): one
root-to-leaf path of live ranks, each in a process of its own, with ghosts for the other
branches, times a round's way through the tree when no rank is late.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import selectors
import socket
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any


def _control_without_torch() -> None:
    """Import the control room's pure modules without the package's torch-importing front."""
    if "hora.collectives" not in sys.modules:
        package = types.ModuleType("hora.collectives")
        package.__path__ = [str(Path(__file__).resolve().parents[2] / "hora" / "collectives")]
        sys.modules["hora.collectives"] = package


_control_without_torch()

from hora.collectives._control import channel  # noqa: E402 - after the stand-in above
from hora.collectives._control.relay import Relay  # noqa: E402
from hora.collectives._control.tree import NegotiationTree  # noqa: E402
from hora.collectives._messages import (  # noqa: E402
    ALLREDUCE,
    Bucket,
    CacheDrop,
    Failure,
    Request,
    Shutdown,
)

NBYTES = 4096  # each simulated tensor: 1,024 float32 (the data path is never run)


class SimRank:
    """One simulated rank: its relay, its half of the response cache (ids learned from rank 0's
    announcements), and a running digest of the operations it was told to run, in order."""

    def __init__(
        self,
        rank: int,
        parent: tuple[int, socket.socket],
        children: dict[int, socket.socket],
        names: list[str],
        rounds: int,
        faults: dict[str, Any],
        stands_for: list[int] | None = None,
    ) -> None:
        self.rank = rank
        self.stands_for = stands_for  # a ghost's whole subtree (see the module's docstring)
        self.parent_rank, self.parent = parent
        self.children = children
        self.names = names
        self.rounds = rounds
        self.relay = Relay(rank, tuple(children), lambda cid: True)  # one process set: the world's
        self.id_of: dict[str, int] = {}
        self.name_of: dict[int, str] = {}
        self.drops = 0
        self.todo: set[str] = set()
        self.done = 0  # rounds completed
        self.digest = hashlib.blake2b(digest_size=16)
        self.ended: str | None = None  # why this rank's loop stopped
        self.exit_at = faults.get("exit", {}).get(str(rank))
        self.hang_at = faults.get("hang", {}).get(str(rank))
        self.exited_at: float | None = None

    def start_round(self, now: float) -> None:
        round_no = self.done + 1
        if round_no == self.exit_at:
            self.die(now)
            return
        if round_no == self.hang_at or self.done >= self.rounds:
            return
        self.todo = set(self.names)
        items: list[Any] = [
            self.id_of.get(n)
            if n in self.id_of
            else Request(n, ALLREDUCE, 0, ("float32",), ((NBYTES // 4,),), "cpu", NBYTES)
            for n in self.names
        ]
        if self.stands_for and not all(type(i) is int for i in items):
            # a ghost's first round: every rank of its subtree sends its requests by name
            self.relay.out.extend((r, False, self.drops, items) for r in self.stands_for)
        else:
            self.relay.own(self.drops, items, now)
        self.send_up()

    def send_up(self) -> None:
        out = self.relay.take()
        if out and self.exited_at is None:
            with contextlib.suppress(OSError):  # the parent is gone: its EOF ends this rank
                channel.send_msg(self.parent, out)

    def from_parent(self, now: float) -> None:
        try:
            payload = channel.recv_payload(self.parent)
        except (ConnectionError, OSError):
            self.lose_parent()
            return
        for child, sock in list(self.children.items()):
            try:
                channel.send_payload(sock, payload)
            except OSError:
                self.lose_child(child, now)
        responses = channel.loads(payload)
        self.relay.heard(responses)
        for resp in responses:
            self._apply(resp)
        if self.ended is None and self.names and not self.todo and self.exited_at is None:
            self.done += 1
            self.start_round(now)

    def _apply(self, resp: Any) -> None:
        kind = type(resp)
        if kind is Bucket:
            for entry in resp.entries:
                self._ran(entry)
        elif kind is CacheDrop:
            for cid in resp.ids:
                self.id_of.pop(self.name_of.pop(cid, ""), None)
            self.drops += 1
        elif kind is Failure:
            self.digest.update(f"failed:{resp.name};".encode())
            self.todo.discard(resp.name)
        elif kind is Shutdown:
            self.ended = resp.reason

    def _ran(self, entry: Any) -> None:
        if type(entry) is int:
            name = self.name_of[entry]
        else:
            name = entry.name
            if entry.cache_id >= 0:
                self.id_of[name], self.name_of[entry.cache_id] = entry.cache_id, name
        self.digest.update(name.encode() + b";")
        self.todo.discard(name)

    def from_child(self, child: int, now: float) -> None:
        try:
            reports = channel.recv_msg(self.children[child])
        except (ConnectionError, OSError):
            self.lose_child(child, now)
            return
        for report in reports:
            self.relay.child(child, report, now)
        self.send_up()

    def lose_child(self, child: int, now: float) -> None:
        """As a worker's round does: rank 0 hears that `child` is gone and stops every rank."""
        sock = self.children.pop(child, None)
        if sock is not None:
            sock.close()
            reason = Shutdown(f"hora shut down (rank {child} disconnected)")
            self.relay.own(self.drops, [reason], now)
            self.send_up()

    def lose_parent(self) -> None:
        """As a worker's loop does when its parent is gone: its subtree stops with it."""
        if self.ended is None:
            whose = f"rank {self.parent_rank}"
            self.ended = f"lost the connection to {whose}"
            down = channel.pack([Shutdown(self.ended)])
            for sock in self.children.values():
                with contextlib.suppress(OSError):
                    channel.send_payload(sock, down)

    def die(self, now: float) -> None:
        self.exited_at = time.time()
        self.ended = "exited"
        for sock in [self.parent, *self.children.values()]:
            sock.close()
        self.children = {}

    def finished(self) -> bool:
        return self.ended is not None or self.done >= self.rounds

    def sockets(self) -> list[tuple[socket.socket, int]]:
        return [(self.parent, -1), *((s, c) for c, s in self.children.items())]


def _say(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _hear() -> dict[str, Any]:
    line = sys.stdin.readline()
    if not line:
        raise SystemExit(0)
    return dict(json.loads(line))


def _connect_all(
    mine: list[int], tree: NegotiationTree, key: bytes, listeners: dict[int, Any], where: dict
) -> dict[int, tuple[tuple[int, socket.socket], dict[int, socket.socket]]]:
    """Every rank of this process connects to its parent, then accepts its children (the
    order `init()` follows), each in a thread of its own, as each is a process of its own."""
    made: dict[int, Any] = {}
    errors: list[BaseException] = []

    def join(rank: int) -> None:
        try:
            parent = tree.parent(rank)
            assert parent is not None
            up = channel.connect(where[str(parent)], rank, key, 60.0)
            down = {}
            if rank in listeners:
                down = channel.accept_children(listeners[rank], tree.children(rank), key, 60.0)
            made[rank] = ((parent, up), down)
        except BaseException as exc:  # reported to the harness below
            errors.append(exc)

    threads = [threading.Thread(target=join, args=(r,), daemon=True) for r in mine]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return made


def main() -> None:
    config = _hear()
    n, fanout = config["n"], config["fanout"]
    mine = config["ranks"]
    ghosts = set(config.get("ghosts", ()))
    key = bytes.fromhex(config["key"])
    tree = NegotiationTree(n, fanout)
    listeners = {
        r: channel.listen("127.0.0.1") for r in mine if tree.children(r) and r not in ghosts
    }
    _say({"addresses": {str(r): address for r, (_, address) in listeners.items()}})
    where = _hear()["addresses"]
    began = time.monotonic()
    made = _connect_all(mine, tree, key, {r: s for r, (s, _) in listeners.items()}, where)
    ranks = {
        r: SimRank(
            r,
            up,
            down,
            config["names"],
            config["rounds"],
            config.get("faults", {}),
            tree.subtree(r) if r in ghosts else None,
        )
        for r, (up, down) in made.items()
    }
    _say({"connected": time.monotonic() - began})
    _hear()  # go
    _serve(ranks, config.get("seconds", 60.0))


def _serve(ranks: dict[int, SimRank], seconds: float) -> None:
    sel = selectors.DefaultSelector()
    for sim in ranks.values():
        for sock, child in sim.sockets():
            sock.setblocking(True)
            sel.register(sock, selectors.EVENT_READ, (sim, child))
    now = time.monotonic()
    for sim in ranks.values():
        sim.start_round(now)
    deadline = now + seconds
    cpu = time.process_time()
    while time.monotonic() < deadline and not all(s.finished() for s in ranks.values()):
        for key, _ in sel.select(0.05):
            _dispatch(sel, key)
        now = time.monotonic()
        for sim in ranks.values():
            if sim.relay.holding():
                sim.relay.release(now)
                sim.send_up()
    report = {
        str(r): {
            "done": s.done,
            "digest": s.digest.hexdigest(),
            "ended": s.ended,
            "exited_at": s.exited_at,
        }
        for r, s in ranks.items()
    }
    _say({"ranks": report, "cpu_s": time.process_time() - cpu})
    _hear()  # the harness has read the results: close everything
    for sim in ranks.values():
        for sock, _ in sim.sockets():
            sock.close()


def _dispatch(sel: selectors.BaseSelector, key: selectors.SelectorKey) -> None:
    sim, child = key.data
    if key.fileobj.fileno() < 0:  # type: ignore[union-attr]
        return
    now = time.monotonic()
    if child < 0:
        sim.from_parent(now)
    else:
        sim.from_child(child, now)
    if sim.ended is not None or sim.exited_at is not None:
        for sock, _ in sim.sockets():
            with contextlib.suppress(KeyError, ValueError):
                sel.unregister(sock)


if __name__ == "__main__":
    main()
