"""Test hosts on this machine: one network namespace per host on a private bridge.

Each host is an `ip netns` with a veth on the bridge (its own address in a private /24; the
bridge, in the root namespace, gets .1 and is where the driver lives), its own hostname (UTS
namespace), its own tmpfs /dev/shm (mount namespace), an /etc/hosts naming every host and the
driver, and no DNS (an empty resolv.conf: a namespace that asks an unreachable DNS server makes
every JVM start crawl). A long-lived anchor process holds each host's UTS and mount namespaces;
whatever runs "on" a host is started with `nsenter` into the anchor's namespaces, so everything
on one host shares its hostname and /dev/shm.

Every name (bridge, veths, namespaces, /etc/netns folders) starts with the slot's prefix
(`hc0`, `hc1`, ...), and every process the cluster starts carries `HORA_TEST_CLUSTER=<prefix>` in
its environment (inherited by what it starts in turn). A slot is owned through a lock file held
for the life of the owning process, so two runs on one machine take two slots, and whatever a
crashed owner left behind is found by name and tag and removed before the slot is used again.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tests._procs import pids_with_env

TAG = "HORA_TEST_CLUSTER"
STATE_ROOT = Path(tempfile.gettempdir()) / "hora-cluster"
SLOTS = 8
FIRST_SUBNET = ipaddress.ip_network("10.213.57.0/24")  # slot k: the k-th /24 after it
DRIVER_NAME = "driver"
TOOLS = ("ip", "unshare", "nsenter", "tc")
KILL_GRACE_SECONDS = 5.0
ANCHOR_START_SECONDS = 10.0
SHM_SIZE = "1g"  # a ceiling: tmpfs takes memory only as it is used


class ClusterUnavailable(RuntimeError):
    """Network namespaces cannot be made here (the reason says why): the tests skip."""


class ShapingUnsupported(RuntimeError):
    """The kernel lacks what the shape asks for: netem (delay, jitter), nf_tables' netdev
    ingress hook (loss)."""


def why_unavailable() -> str | None:
    """Why namespaced hosts cannot be made on this machine, or None when they can."""
    if os.uname().sysname != "Linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces, veths and a bridge need root"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (iproute2 and util-linux are needed)"
    return None


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a short system command; a failure says which command and what it printed."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed: {(done.stderr or done.stdout).strip()}")
    return done


# ----- slots ----------------------------------------------------------------------------------
@dataclass
class Slot:
    """One cluster's share of the machine: its names, its /24 and its folder, locked to us."""

    index: int
    lock: IO[str]

    @property
    def prefix(self) -> str:
        return f"hc{self.index}"

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network((int(FIRST_SUBNET.network_address) + (self.index << 8), 24))

    @property
    def folder(self) -> Path:
        return STATE_ROOT / self.prefix

    def release(self) -> None:
        with contextlib.suppress(OSError):
            self.lock.close()


def claim_slot() -> Slot:
    """The first slot no live process holds and whose /24 nothing else on this machine uses;
    what a dead owner left there is removed first."""
    STATE_ROOT.mkdir(parents=True, exist_ok=True)
    busy = []
    for index in range(SLOTS):
        lock = open(STATE_ROOT / f"hc{index}.lock", "a+")  # noqa: SIM115 -- held by the Slot
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            busy.append(f"hc{index} (held by a running cluster)")
            continue
        slot = Slot(index, lock)
        clean_slot(slot)
        user = _subnet_user(slot)
        if user:
            slot.release()
            busy.append(f"hc{index} ({slot.subnet} is used by {user})")
            continue
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        return slot
    raise ClusterUnavailable(f"no free test cluster slot: {'; '.join(busy)}")


def _subnet_user(slot: Slot) -> str | None:
    """A device outside this slot with an address or route in the slot's /24, if any."""
    for line in sh("ip", "-4", "-o", "addr", "show").stdout.splitlines():
        fields = line.split()
        if len(fields) > 3 and ipaddress.ip_interface(fields[3]).ip in slot.subnet:
            return f"device {fields[1]}"
    for line in sh("ip", "-4", "route", "show").stdout.splitlines():
        dest = line.split()[0]
        if dest != "default" and ipaddress.ip_network(dest, strict=False).overlaps(slot.subnet):
            return f"route {line.strip()}"
    return None


def tagged_pids(prefix: str) -> list[int]:
    """Live processes whose environment carries this slot's tag."""
    return pids_with_env(TAG, prefix)


def kill_all(pids: Sequence[int], grace: float = KILL_GRACE_SECONDS) -> None:
    """SIGTERM, then SIGKILL whatever is still there after `grace` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        alive = [p for p in pids if _alive(p)]
        for pid in alive:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while any(_alive(p) for p in alive) and time.monotonic() < deadline:
            time.sleep(0.05)


def popen_logged(argv: Sequence[str], env: Mapping[str, str], log: Path) -> subprocess.Popen:
    """Start a long-lived process in a session of its own, its output appended to `log`."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv,
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _alive(pid: int) -> bool:
    """Running, and not a zombie (whose parent has not reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _namespaces(prefix: str) -> list[str]:
    names = [line.split()[0] for line in sh("ip", "netns", "list").stdout.splitlines() if line]
    return [n for n in names if n.startswith(f"{prefix}-")]


def _links(prefix: str) -> list[str]:
    names = re.findall(r"^\d+: ([^:@]+)", sh("ip", "-o", "link", "show").stdout, re.M)
    return [n for n in names if re.fullmatch(rf"{prefix}(br|v\d+|p\d+)", n)]


def clean_slot(slot: Slot, keep_logs: bool = False) -> None:
    """Remove everything of this slot: processes, namespaces, links (their qdiscs go with
    them), its lossy links' nftables tables, /etc/netns folders and (unless `keep_logs`: the
    last run's, for a post-mortem) the slot's folder of logs and work files. Safe to run on a
    clean slot."""
    prefix = slot.prefix
    namespaces = _namespaces(prefix)
    in_namespaces = [
        int(p)
        for ns in namespaces
        for p in sh("ip", "netns", "pids", ns, check=False).stdout.split()
    ]
    kill_all(sorted(set(tagged_pids(prefix) + in_namespaces)))
    for ns in namespaces:
        sh("ip", "netns", "del", ns, check=False)
    for link in _links(prefix):
        sh("ip", "link", "del", link, check=False)
    for table in _loss_tables(prefix):  # the hosts' own go with their namespaces
        sh("nft", "delete", "table", "netdev", table, check=False)
    for folder in Path("/etc/netns").glob(f"{prefix}-*"):
        shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):
        Path("/etc/netns").rmdir()  # only if empty: another slot, or another tool, may use it
    if not keep_logs:
        shutil.rmtree(slot.folder, ignore_errors=True)


# ----- shaping --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """What a link does to traffic: a rate (tbf), delay and jitter (netem), and random loss
    (nftables: many kernels, this one among them, have no netem)."""

    rate: str | None = None  # tc's units: "1gbit", "100mbit"
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0  # of the packets each way; 100: the link drops everything

    @classmethod
    def parse(cls, text: str) -> Shape:
        """`1gbit,0.2ms` or `1gbit,5ms,1ms,1%`: a rate, then delay and jitter, and a loss."""
        rate, times, loss = None, [], 0.0
        for item in (i.strip() for i in text.split(",") if i.strip()):
            if item.endswith("bit"):
                rate = item
            elif item.endswith("%"):
                loss = float(item[:-1])
            elif item.endswith("ms"):
                times.append(float(item[:-2]))
            elif item.endswith("us"):
                times.append(float(item[:-2]) / 1000)
            else:
                raise ValueError(f"{item!r} in --shape {text!r}: expected e.g. 1gbit, 5ms, 1%")
        if len(times) > 2:
            raise ValueError(f"--shape {text!r}: at most a delay and a jitter")
        if not 0 <= loss <= 100:
            raise ValueError(f"--shape {text!r}: a loss is 0% to 100%")
        delay, jitter = ([*times, 0.0, 0.0])[:2]
        return cls(rate, delay, jitter, loss)

    @property
    def needs_netem(self) -> bool:
        return bool(self.delay_ms or self.jitter_ms)

    @property
    def needs_qdisc(self) -> bool:
        return self.rate is not None or self.needs_netem

    def qdisc(self) -> list[str]:
        """The `tc qdisc replace ... root` arguments for this shape's rate, delay and jitter
        (its loss is nftables' rules: `loss_rules`)."""
        if not self.needs_netem:
            if self.rate is None:
                raise ValueError("no rate, delay or jitter: no qdisc")
            # A burst of 4 ms at the rate, and never less than a 64 KiB GSO segment.
            burst = max(_bits_per_second(self.rate) // 8 // 250, 128 * 1024)
            return ["tbf", "rate", self.rate, "burst", str(burst), "latency", "50ms"]
        netem = ["netem", "delay", f"{self.delay_ms}ms"]
        if self.jitter_ms:
            netem += [f"{self.jitter_ms}ms"]
        if self.rate:
            netem += ["rate", self.rate]
        return netem

    def loss_rules(self) -> list[str]:
        """The nft rules of a chain that drops `loss_pct`% of its packets at random: a counter
        of every packet, then one of the dropped (`Network.lost` reads them)."""
        if self.loss_pct >= 100:
            return ["counter", "counter drop"]
        per_10000 = round(self.loss_pct * 100)
        return ["counter", f"numgen random mod 10000 < {per_10000} counter drop"]


def _bits_per_second(rate: str) -> int:
    match = re.fullmatch(r"([\d.]+)([kmgt]?)bit", rate.lower())
    if not match:
        raise ValueError(f"rate {rate!r}: expected e.g. 100mbit or 1gbit")
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}[match.group(2)]
    return int(float(match.group(1)) * scale)


# ----- hosts ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Host:
    """One namespaced host: its hostname, address, namespace and the bridge end of its veth."""

    index: int  # 1, 2, ...
    name: str  # its hostname, "host1"
    address: str
    netns: str
    veth: str  # the bridge's end, in the root namespace


class Network:
    """A bridge and `count` namespaced hosts on it, made by `start()` and removed by `stop()`."""

    def __init__(self, slot: Slot, count: int, base_env: Mapping[str, str]):
        if not 1 <= count <= 200:
            raise ValueError(f"hosts must be 1..200, got {count}")
        self.slot = slot
        self.prefix = slot.prefix
        self.bridge = f"{self.prefix}br"
        addresses = list(slot.subnet.hosts())
        self.driver_address = str(addresses[0])
        self.hosts = [
            Host(i, f"host{i}", str(addresses[i]), f"{self.prefix}-host{i}", f"{self.prefix}v{i}")
            for i in range(1, count + 1)
        ]
        self.base_env = dict(base_env)
        self._anchors: dict[str, subprocess.Popen[str]] = {}

    def host(self, name: str) -> Host:
        """A host by hostname, address or namespace."""
        for host in self.hosts:
            if name in (host.name, host.address, host.netns):
                return host
        raise ValueError(f"no host {name!r}: the hosts are {[h.name for h in self.hosts]}")

    # -- making and removing -------------------------------------------------------------
    def start(self) -> None:
        try:
            sh("ip", "link", "add", self.bridge, "type", "bridge")
        except RuntimeError as exc:
            raise ClusterUnavailable(f"cannot make a Linux bridge here: {exc}") from None
        sh("ip", "addr", "add", f"{self.driver_address}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for host in self.hosts:
            self._make_host(host)
        for host in self.hosts:
            self._anchors[host.name] = self._anchor(host)
        self._check_hosts_reach_each_other()

    def _make_host(self, host: Host) -> None:
        peer = f"{self.prefix}p{host.index}"
        etc = Path("/etc/netns") / host.netns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(self.etc_hosts())
        (etc / "resolv.conf").write_text("")  # no DNS at all: names come from /etc/hosts
        sh("ip", "netns", "add", host.netns)
        sh("ip", "link", "add", host.veth, "type", "veth", "peer", "name", peer)
        sh("ip", "link", "set", host.veth, "master", self.bridge, "up")
        sh("ip", "link", "set", peer, "netns", host.netns)
        inside = ("ip", "-n", host.netns)
        sh(*inside, "link", "set", peer, "name", "eth0")
        sh(*inside, "addr", "add", f"{host.address}/24", "dev", "eth0")
        sh(*inside, "link", "set", "eth0", "up")
        sh(*inside, "link", "set", "lo", "up")

    def etc_hosts(self) -> str:
        lines = ["127.0.0.1 localhost", f"{self.driver_address} {DRIVER_NAME}"]
        lines += [f"{h.address} {h.name}" for h in self.hosts]
        return "\n".join(lines) + "\n"

    def _anchor(self, host: Host) -> subprocess.Popen[str]:
        """A process that holds the host's UTS and mount namespaces (hostname, /dev/shm)."""
        script = (
            'hostname "$0" && mount -t tmpfs -o size=$1,mode=1777 hora-shm /dev/shm'
            " && echo ready && exec sleep infinity"
        )
        argv = ["ip", "netns", "exec", host.netns, "unshare", "--uts", "--mount"]
        argv += ["--propagation", "private", "sh", "-c", script, host.name, SHM_SIZE]
        anchor = subprocess.Popen(
            argv, env=self.base_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert anchor.stdout is not None
        line = anchor.stdout.readline().strip()  # "ready", or why not (the process then ends)
        if line != "ready":
            anchor.kill()
            rest = anchor.communicate(timeout=ANCHOR_START_SECONDS)[0]
            raise ClusterUnavailable(f"cannot make host {host.name}'s namespaces: {line} {rest}")
        anchor.stdout.close()
        return anchor

    def _check_hosts_reach_each_other(self) -> None:
        """A TCP connection from the first host to each other one, over the bridge. Where the
        kernel passes bridged traffic through iptables (br_netfilter) and the FORWARD policy
        is DROP (Docker sets it), hosts reach the driver but not each other, and a
        cross-host collective would hang instead."""
        first, port = self.hosts[0], 9  # each namespace has its own ports: 9 is free there
        serve = "import socket,sys; s=socket.create_server((sys.argv[1],9)); s.settimeout(10)"
        serve += "; s.accept()[0].sendall(b'ok')"
        dial = "import socket,sys,time\nfor _ in range(100):\n try:\n"
        dial += "  print(socket.create_connection((sys.argv[1],9),timeout=5).recv(2).decode())"
        dial += "\n  break\n except ConnectionRefusedError: time.sleep(0.05)"
        for other in self.hosts[1:]:
            listener = subprocess.Popen(
                [*self.enter(other), sys.executable, "-c", serve, other.address],
                env=self.base_env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                said = self.run(first, [sys.executable, "-c", dial, other.address], timeout=30)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                said = str(exc)
            finally:
                listener.kill()
                listener.wait()
            if said.strip() != "ok":
                why = said.strip().splitlines()[-1] if said.strip() else "no answer"
                raise RuntimeError(
                    f"{first.name} cannot reach {other.name}:{port} over the bridge {self.bridge}"
                    f" ({why}). If br_netfilter is loaded "
                    "(net.bridge.bridge-nf-call-iptables=1) and iptables' FORWARD policy is DROP "
                    f"(as Docker sets it), allow the bridge: iptables -I FORWARD -i {self.bridge} "
                    f"-o {self.bridge} -j ACCEPT"
                )

    def stop(self) -> None:
        """Remove every host and the bridge; the processes on the hosts are killed first."""
        for anchor in self._anchors.values():
            with contextlib.suppress(Exception):
                anchor.kill()
                anchor.wait(timeout=5)
        self._anchors.clear()
        clean_slot(self.slot, keep_logs=True)

    # -- running things on a host ----------------------------------------------------------
    def enter(self, host: Host) -> list[str]:
        """The command prefix that runs a command on `host` (network, hostname, /dev/shm), in
        the folder `/`."""
        anchor = self._anchors[host.name].pid
        return ["nsenter", f"--target={anchor}", "--net", "--uts", "--mount", "--"]

    def popen(
        self,
        host: Host,
        argv: Sequence[str],
        env: Mapping[str, str],
        log: Path,
    ) -> subprocess.Popen:
        """Start `argv` on `host` in a session of its own, output to `log`."""
        return popen_logged([*self.enter(host), *argv], env, log)

    def run(self, host: Host, argv: Sequence[str], timeout: float = 60) -> str:
        """Run a short command on `host` and return its output (raises if it fails)."""
        done = subprocess.run(
            [*self.enter(host), *argv],
            env=self.base_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} on {host.name}: {done.stderr.strip()}")
        return done.stdout

    def pids(self, host: Host) -> list[int]:
        """Every process on `host` but its anchor."""
        anchor = self._anchors[host.name].pid
        found = sh("ip", "netns", "pids", host.netns, check=False).stdout.split()
        return [int(p) for p in found if int(p) != anchor]

    def kill_host(self, host: Host) -> list[int]:
        """A host vanishing: every process on it SIGKILLed at once. Returns their pids."""
        pids = self.pids(host)
        kill_all(pids, grace=0.0)
        return pids

    # -- the network -----------------------------------------------------------------------
    def cut_off(self, host: Host) -> None:
        """Pull `host`'s cable: its veth goes down, its processes live on, unreachable."""
        sh("ip", "link", "set", host.veth, "down")

    def restore(self, host: Host) -> None:
        sh("ip", "link", "set", host.veth, "up")

    def shape(self, shape: Shape, hosts: Sequence[Host] | None = None) -> None:
        """Apply `shape` to both directions of each host's link (every host by default),
        replacing what was there."""
        for host in hosts or self.hosts:
            for inside, dev in ((False, host.veth), (True, "eth0")):
                where = ("ip", "netns", "exec", host.netns) if inside else ()
                if not shape.needs_qdisc:
                    sh(*where, "tc", "qdisc", "del", "dev", dev, "root", check=False)
                    continue
                command = ("tc", "qdisc", "replace", "dev", dev, "root", *shape.qdisc())
                done = sh(*where, *command, check=False)
                if done.returncode != 0:
                    if "unknown" in done.stderr.lower():
                        kind = shape.qdisc()[0]
                        raise ShapingUnsupported(
                            f"this kernel has no {kind} qdisc (CONFIG_NET_SCH_{kind.upper()}): "
                            f"{shape} cannot be applied"
                        )
                    raise RuntimeError(f"tc on {host.name}'s {dev}: {done.stderr.strip()}")
            self._set_loss(host, shape)

    def clear_shape(self, hosts: Sequence[Host] | None = None) -> None:
        for host in hosts or self.hosts:
            sh("tc", "qdisc", "del", "dev", host.veth, "root", check=False)
            inside = ("ip", "netns", "exec", host.netns)
            sh(*inside, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
            self._set_loss(host, Shape())

    # Random loss: a netdev table with an ingress chain at each end of the host's veth: in the
    # root namespace on the bridge's end (what the host sends; its table named after the slot
    # and host, so that `clean_slot` finds it), and in the host's namespace on eth0 (what it
    # receives; gone with the namespace). Both are ingress hooks (any kernel since 4.2), where
    # a dropped packet is lost on the wire: the sender's stack has sent it (a drop on the
    # sender's own egress would be reported back to its TCP, which is no loss).
    def _loss_ends(self, host: Host) -> list[tuple[tuple[str, ...], str, str]]:
        """(command prefix, table, device) for each direction of `host`'s link."""
        inside = ("ip", "netns", "exec", host.netns)
        return [((), _loss_table(self.prefix, host.name), host.veth), (inside, "hora_loss", "eth0")]

    def _set_loss(self, host: Host, shape: Shape) -> None:
        for where, table, dev in self._loss_ends(host):
            if not shape.loss_pct:
                if shutil.which("nft") is not None:
                    sh(*where, "nft", "delete", "table", "netdev", table, check=False)
                continue
            if shutil.which("nft") is None:
                raise RuntimeError(
                    "nft is not installed: a lossy link needs nftables (`make setup` installs "
                    "it: apt-get install nftables)"
                )
            script = [
                f"table netdev {table} {{}}",
                f"delete table netdev {table}",  # whatever loss was there before
                f"table netdev {table} {{",
                "chain c {",
                f'type filter hook ingress device "{dev}" priority 0; policy accept;',
                *shape.loss_rules(),
                "}",
                "}",
            ]
            done = subprocess.run(
                [*where, "nft", "-f", "-"],
                input="\n".join(script) + "\n",
                capture_output=True,
                text=True,
                timeout=60,
            )
            if done.returncode != 0:
                why = done.stderr.strip()
                if "not supported" in why.lower() or "no such file" in why.lower():
                    raise ShapingUnsupported(
                        f"nftables cannot drop packets at {host.name}'s {dev} on this kernel "
                        f"(nf_tables with netdev ingress hooks, CONFIG_NF_TABLES_NETDEV): {why}"
                    )
                raise RuntimeError(f"nft on {host.name}'s {dev}: {why}")

    def lost(self, host: Host) -> tuple[int, int]:
        """(packets, of them dropped) by `host`'s loss rules since they were set, both ways."""
        seen = dropped = 0
        for where, table, _ in self._loss_ends(host):
            done = sh(*where, "nft", "-j", "list", "table", "netdev", table)
            counters = [
                item["rule"]["expr"]
                for item in json.loads(done.stdout)["nftables"]
                if "rule" in item
            ]
            packets = [
                expr["counter"]["packets"]
                for rule in counters
                for expr in rule
                if "counter" in expr
            ]
            seen, dropped = seen + packets[0], dropped + packets[1]
        return seen, dropped


def _loss_table(prefix: str, host: str) -> str:
    return f"hora_{prefix}_{host}"


def _loss_tables(prefix: str) -> list[str]:
    """The root namespace's loss tables of this slot (none where nft is not installed)."""
    if shutil.which("nft") is None:
        return []
    listed = sh("nft", "list", "tables", "netdev", check=False).stdout
    return re.findall(rf"^table netdev ({_loss_table(prefix, '')}\w+)$", listed, re.M)
