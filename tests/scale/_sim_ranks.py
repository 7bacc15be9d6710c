"""Many simulated ranks in one process: `python -m tests.scale._sim_ranks`, one per sim host group.

Each rank is one authenticated socket to the driver's job channel, speaking hora's real protocol
(`hora.wire.protocol`): Hello, then its Payload; then what a real rank of an elastic run does
with the launcher's store at start (hora's own presence barrier, `_rendezvous._all_present`, on
a TCPStore client of its own, counted op by op), Formed and InPlace; then heartbeats every
`heartbeat_s`, a metric every `metrics_s` and an output line every `output_s`. A `Reform` sends
it through the world's barrier again under the new generation (Formed; its new rank 0 Reformed).
All sockets are multiplexed by one selector; only the store's blocking calls get a thread each.

The launcher (tests/scale/_driver_sim.py) reads this process's stdout: `OUT <id> <stream>
<text>` (a line the rank printed), `EXIT <id> <code>` (the rank's process ended) and `EV <json>`
(a timed event for the harness: ready, lost, hung, formed, reform). On stdin, after the config
line, it takes `exit <id>` (the rank's process dies: sockets closed, its exit reported) and
`hang <id>` (it goes silent, its socket open).
"""

from __future__ import annotations

import heapq
import json
import os
import random
import selectors
import socket
import struct
import sys
import threading
import time
from datetime import timedelta
from typing import Any

from hora.wire import channel
from hora.wire.protocol import (
    ALLOWED,
    DumpStacks,
    Formed,
    Heartbeat,
    Hello,
    InPlace,
    Metrics,
    Payload,
    Reform,
    Reformed,
    Stacks,
)

_HEADER = struct.Struct("!Q")
CONNECT_AT_ONCE = 16
_stdout_lock = threading.Lock()


def say(line: str) -> None:
    with _stdout_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def event(**fields: Any) -> None:
    say("EV " + json.dumps(fields))


class CountingStore:
    """The rank's store as hora's code sees it, counting every operation it makes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.ops = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.ops += 1
            return method(*args, **kwargs)

        return counted


class Rank:
    def __init__(self, ident: int, host: str, sock: socket.socket) -> None:
        self.ident = ident
        self.host = host
        self.sock = sock
        self.buffer = bytearray()
        self.lock = threading.Lock()
        self.alive = True
        self.hung = False
        self.has_job = False
        self.last_sent = time.monotonic()
        self.client: Any = None  # its TCPStore client, made on its first barrier

    def send(self, message: Any) -> None:
        if not self.alive or self.hung:
            return
        payload = channel.pack(message)
        with self.lock:
            try:
                self.sock.sendall(_HEADER.pack(len(payload)) + payload)
            except OSError:
                return
            self.last_sent = time.monotonic()


class Sim:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.address = (cfg["address"][0], int(cfg["address"][1]))
        self.secret = bytes.fromhex(cfg["secret"])
        self.selector = selectors.DefaultSelector()
        self.ranks: dict[int, Rank] = {}
        self.timers: list[tuple[float, int, str, int]] = []
        self.seq = 0
        self.rendezvous: Any = None
        self.t0 = float(cfg["t0"])
        self.stop = False
        rng = random.Random(cfg.get("seed", 0))
        self.phase = {i: rng.random() for i in cfg["ids"]}

    # -- set-up ---------------------------------------------------------------------------------
    def import_rendezvous(self) -> None:
        """hora's rank-side rendezvous (it imports torch, in the main thread)."""
        from hora.collectives import _rendezvous
        from hora.wire import link

        class _Quiet:  # a link for the process: hora's barrier waits on its Reform condition
            def send(self, message: Any) -> None:
                pass

        link.attach(link.DriverLink(_Quiet(), -1, self.secret))  # type: ignore[arg-type]
        self.rendezvous = _rendezvous

    def connect(self, ident: int) -> None:
        """One rank dials the driver and says hello (a real rank's bootstrap)."""
        sock = socket.create_connection(self.address, timeout=60)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        channel.authenticate_as_client(sock, self.secret)
        sock.settimeout(None)
        rank = Rank(ident, self.cfg["hosts"][str(ident)], sock)
        self.ranks[ident] = rank
        self.selector.register(sock, selectors.EVENT_READ, rank)
        rank.send(Hello(ident, os.getpid(), rank.host))

    # -- timers ---------------------------------------------------------------------------------
    def at(self, when: float, kind: str, ident: int) -> None:
        self.seq += 1
        heapq.heappush(self.timers, (when, self.seq, kind, ident))

    def fire(self, now: float) -> None:
        while self.timers and self.timers[0][0] <= now:
            _, _, kind, ident = heapq.heappop(self.timers)
            rank = self.ranks.get(ident)
            if rank is None or not rank.alive:
                continue
            every = self.cfg[f"{kind}_s"]
            if kind == "heartbeat" and self.cfg["beats"] == "when quiet":
                if now - rank.last_sent < every:  # a rank's other words say it is there
                    self.at(rank.last_sent + every, kind, ident)
                    continue
                rank.send(Heartbeat(ident))
            elif kind == "heartbeat":
                rank.send(Heartbeat(ident))
            elif kind == "metrics":
                step = int((now - self.t0) / every)
                rank.send(Metrics(ident, step, {"loss": 1.0 / (1 + step), "rank": ident}))
            elif kind == "output" and not rank.hung:
                say(f"OUT {ident} stdout step of rank {ident} at {now - self.t0:.1f} s")
            self.at(now + every, kind, ident)

    # -- the channel ----------------------------------------------------------------------------
    def read(self, rank: Rank) -> None:
        try:
            chunk = rank.sock.recv(1 << 16)
        except OSError:
            chunk = b""
        if not chunk:  # the driver closed it: a real worker kills itself
            self.die(rank, code=-9)
            return
        rank.buffer += chunk
        while len(rank.buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(rank.buffer)
            if len(rank.buffer) < _HEADER.size + size:
                break
            payload = bytes(rank.buffer[_HEADER.size : _HEADER.size + size])
            del rank.buffer[: _HEADER.size + size]
            self.heard(rank, channel.loads(payload, ALLOWED))

    def heard(self, rank: Rank, message: Any) -> None:
        now = time.monotonic()
        if isinstance(message, Payload):
            rank.has_job = True  # a real rank's heartbeats start with its job
            self.at(now + self.phase[rank.ident] * self.cfg["heartbeat_s"], "heartbeat", rank.ident)
            self.barrier(rank, 0, rank.ident, self.cfg["size"], now)
        elif isinstance(message, Reform):
            event(reform=rank.ident, t=now, generation=message.generation)
            place = message.place
            self.barrier(rank, message.generation, place.rank, place.size, now)
        elif isinstance(message, DumpStacks):
            rank.send(Stacks(rank.ident, f"simulated rank {rank.ident}: in its training loop"))

    def barrier(self, rank: Rank, generation: int, at: int, size: int, since: float) -> None:
        """What a real rank does with the launcher's store as its world forms: hora's own
        presence barrier, then Formed (and, at start, InPlace; a re-formed world's rank 0
        says Reformed)."""
        threading.Thread(
            target=self._barrier, args=(rank, generation, at, size, since), daemon=True
        ).start()

    def _barrier(self, rank: Rank, generation: int, at: int, size: int, since: float) -> None:
        import torch.distributed as dist

        wait = timedelta(seconds=self.cfg["wait_s"])
        if rank.client is None:
            rank.client = dist.TCPStore("127.0.0.1", self.cfg["store_port"], is_master=False,
                                        timeout=wait)  # fmt: skip
        made = time.monotonic()
        store = CountingStore(dist.PrefixStore(f"hora/reform/{generation}/", rank.client))
        try:
            if generation or self.cfg["start_barrier"]:
                self.rendezvous._all_present(store, at, size, generation, wait)
        except Exception as error:
            event(barrier_failed=rank.ident, error=str(error)[:200])
            return
        rank.send(Formed(rank.ident, generation))
        now = time.monotonic()
        if generation == 0:
            rank.send(InPlace(rank.ident, True, False))
            event(ready=rank.ident, t=now, ops=store.ops, job=since, client=made)
            for kind in ("metrics", "output"):
                self.later(now + self.phase[rank.ident] * self.cfg[f"{kind}_s"], kind, rank.ident)
        else:
            if at == 0:
                rank.send(Reformed(rank.ident, generation, size, 0))
            event(formed=rank.ident, t=now, generation=generation, ops=store.ops, rank=at)

    def later(self, when: float, kind: str, ident: int) -> None:
        """A timer from another thread: handed to the loop through its wake-up socket."""
        with self.pending_lock:
            self.pending.append((when, kind, ident))
        self.wake_w.send(b"x")

    # -- the harness's commands -----------------------------------------------------------------
    def command(self, line: str) -> None:
        what, _, arg = line.strip().partition(" ")
        rank = self.ranks.get(int(arg)) if arg else None
        if rank is None:
            return
        if what == "exit":
            now = time.monotonic()
            self.die(rank, code=-9)
            event(lost=rank.ident, t=now)
        elif what == "hang":
            with rank.lock:
                rank.hung = True
            event(hung=rank.ident, t=rank.last_sent)

    def die(self, rank: Rank, code: int) -> None:
        if not rank.alive:
            return
        rank.alive = False
        self.selector.unregister(rank.sock)
        rank.sock.close()
        say(f"EXIT {rank.ident} {code}")

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> None:
        self.pending: list[tuple[float, str, int]] = []
        self.pending_lock = threading.Lock()
        self.wake_r, self.wake_w = socket.socketpair()
        self.commands = b""
        self.connected = False
        self.import_rendezvous()  # (imports torch) first: a busy loop would seem silent
        self.selector.register(sys.stdin, selectors.EVENT_READ, None)
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        dialing = list(self.cfg["ids"])
        while not self.stop:
            for ident in dialing[:CONNECT_AT_ONCE]:  # the ranks that said hello hear their job
                self.connect(ident)
            del dialing[:CONNECT_AT_ONCE]
            if not dialing and not self.connected:
                self.connected = True
                event(connected=len(self.ranks), t=time.monotonic())
            timeout = max(0.0, self.timers[0][0] - time.monotonic()) if self.timers else 1.0
            timeout = 0.0 if dialing else timeout
            for key, _ in self.selector.select(min(timeout, 1.0)):
                if key.data is None:
                    chunk = os.read(sys.stdin.fileno(), 4096)
                    if not chunk:
                        return  # the launcher is gone
                    self.commands += chunk
                    *lines, self.commands = self.commands.split(b"\n")
                    for line in lines:
                        self.command(line.decode())
                elif key.data == "wake":
                    self.wake_r.recv(4096)
                    with self.pending_lock:
                        pending, self.pending = self.pending, []
                    for when, kind, ident in pending:
                        self.at(when, kind, ident)
                else:
                    self.read(key.data)
            self.fire(time.monotonic())


def main() -> None:
    line = b""
    while not line.endswith(b"\n"):  # unbuffered: the commands that follow stay in the pipe
        line += os.read(sys.stdin.fileno(), 1)
    cfg = json.loads(line)
    Sim(cfg).run()
    os._exit(0)


if __name__ == "__main__":
    main()
