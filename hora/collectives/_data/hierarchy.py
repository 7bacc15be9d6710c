"""The hierarchical data path of a job on several hosts (Horovod's hierarchical allreduce and
allgather): the ranks of a host meet through shared memory (`shm`), and only what must cross
the network goes through gloo, between hosts.

With the same number of ranks on every host, every local rank works on its own slice, in
parallel with the others, as Horovod's hierarchical allreduce and NCCL do:
  allreduce   each local rank reduces its share of the buffer within the host, allreduces that
              share with the ranks of the same local index on the other hosts (a gloo group per
              local index), and the host's ranks copy every share out; pipelined piece by piece
              (`LocalReducer.allreduce(between=)`), so the network sees each piece once it is
              reduced;
  allgather   each rank gathers the rows of the ranks of its local index on every host (gloo),
              then the host's ranks gather those among themselves (shared memory);
  broadcast   the root's local index carries the buffer across hosts (gloo), then each host
              shares it (shared memory).
Where hosts run different numbers of ranks, one leader per host (local rank 0) does the
crossing: the host reduces (or gathers) to every rank, the leaders allreduce (allgather,
broadcast) among themselves, and each leader shares the result with its host.

Per host, only 1/local_size of the flat path's traffic crosses the network per rank, and gloo's
ring sees one rank per host. Every rank gets bitwise the same result: each element is reduced
once within its host (in local rank order), across hosts by gloo once (which hands every rank
the same bits), and then copied. Against the flat path the order of the operands differs, so
floating-point sums and products may differ in the last bits; integers, Min and Max are exact,
and allgather and broadcast move the same bytes.

Chosen at init when the job spans several hosts, its ranks are numbered host by host and some
host runs more than one rank; `HOROVOD_HIERARCHICAL_ALLREDUCE=0` keeps allreduces flat,
`HOROVOD_HIERARCHICAL_ALLGATHER=0` allgathers and broadcasts, `HORA_SHM=0` everything. Serves
CPU tensors of the global process set; process sets and CUDA tensors keep their transports.
"""

from __future__ import annotations

import contextlib
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hora.collectives._data import shm, shm_setup
from hora.collectives._data.dtypes import as_bytes, scale_
from hora.collectives._data.transports import REDUCE_OPS, all_gather_single
from hora.placement import RankPlacement, hosts_of

ALLREDUCE_VAR = "HOROVOD_HIERARCHICAL_ALLREDUCE"
ALLGATHER_VAR = "HOROVOD_HIERARCHICAL_ALLGATHER"  # broadcast follows it too
OFF = ("0", "false", "no", "off")


def wanted(name: str) -> bool:
    """Whether this process lets `name`'s operations go hierarchical: yes unless it says no."""
    return os.environ.get(name, "").strip().lower() not in OFF


class Hierarchy:
    """This rank's part of the hierarchical data path: its host's reducer and its gloo group
    across hosts (None for a rank that is not its host's leader, where leaders cross)."""

    def __init__(
        self,
        local: shm.LocalReducer,
        cross: Any,
        hosts: list[list[int]],
        rank: int,
        leaders: bool,
        allreduce: bool,
        allgather: bool,
    ) -> None:
        self.local = local
        self.cross = cross
        self.hosts = hosts
        self.leaders = leaders
        self.allreduce_on = allreduce
        self.allgather_on = allgather  # allgather and broadcast
        self.place = {r: (h, i) for h, ranks in enumerate(hosts) for i, r in enumerate(ranks)}
        self.host, self.index = self.place[rank]

    def allreduce(self, src: torch.Tensor, dst: torch.Tensor, op: int, scale: float) -> None:
        """`dst` = the reduction of every rank's `src` (flat, contiguous; `dst` may be `src`),
        times `scale`."""
        if not dst.numel():
            return
        reduce_op = REDUCE_OPS[op]
        if not self.leaders:
            group = self.cross

            def across(piece: torch.Tensor) -> None:
                dist.all_reduce(piece, op=reduce_op, group=group)

            self.local.allreduce(src, dst, op, scale, between=across)
            return
        self.local.allreduce(src, dst, op)
        if self.cross is not None:
            dist.all_reduce(dst, op=reduce_op, group=self.cross)
        self.local.broadcast(as_bytes(dst), 0)
        scale_(dst, scale)

    def allgather(self, recv: torch.Tensor, send: torch.Tensor) -> None:
        """`recv` (bytes) = every rank's `send` (bytes, the same count everywhere), in rank
        order."""
        seg = send.numel()
        count, size = len(self.hosts), len(self.place)
        if not self.leaders:
            across = torch.empty(count * seg, dtype=torch.uint8)
            all_gather_single(across, send, group=self.cross)  # [host] of this local index
            here = torch.empty(size * seg, dtype=torch.uint8)
            self.local.allgather(across, here)  # [local index][host]
            per_host = size // count
            recv.view(count, per_host, seg).copy_(here.view(per_host, count, seg).transpose(0, 1))
            return
        mine = self.hosts[self.host]
        self.local.allgather(send, recv[mine[0] * seg : (mine[-1] + 1) * seg])
        if self.cross is not None:
            widest = max(len(ranks) for ranks in self.hosts) * seg
            block = torch.zeros(widest, dtype=torch.uint8)
            block[: len(mine) * seg].copy_(recv[mine[0] * seg : (mine[-1] + 1) * seg])
            blocks = torch.empty(count * widest, dtype=torch.uint8)
            all_gather_single(blocks, block, group=self.cross)
            for h, ranks in enumerate(self.hosts):
                if h != self.host:
                    n = len(ranks) * seg
                    recv[ranks[0] * seg : ranks[0] * seg + n].copy_(blocks[h * widest :][:n])
        self.local.broadcast(recv, 0)

    def broadcast(self, buf: torch.Tensor, root: int) -> None:
        """`buf` (bytes) = the one of global rank `root`."""
        host, index = self.place[root]
        if not self.leaders:
            if self.index == index:
                dist.broadcast(buf, src=root, group=self.cross)
            self.local.broadcast(buf, index)
            return
        if self.host == host:
            self.local.broadcast(buf, index)
        if self.cross is not None:
            dist.broadcast(buf, src=self.hosts[host][0], group=self.cross)
        if self.host != host:
            self.local.broadcast(buf, 0)

    def close(self) -> None:
        self.local.close()
        if self.cross is not None:
            with contextlib.suppress(Exception):
                dist.destroy_process_group(self.cross)
            self.cross = None


def connect(
    place: RankPlacement,
    token: bytes,
    key: bytes,
    world: Any,
    wait: timedelta,
) -> Hierarchy | None:
    """Set up the hierarchical path for a job on several hosts, or None where it does not fit
    (or is turned off) and the flat path serves. Every rank of the world calls it with its
    `place`; all decide alike, from what all of them say (their placement and their
    settings)."""
    mine = (place, wanted(ALLREDUCE_VAR), wanted(ALLGATHER_VAR))
    said: list[Any] = [None] * dist.get_world_size(world)
    dist.all_gather_object(said, mine, group=world)
    hosts = hosts_of([theirs for theirs, _, _ in said])
    allreduce = all(reduce_on for _, reduce_on, _ in said)
    allgather = all(gather_on for _, _, gather_on in said)
    if hosts is None or len(hosts) < 2 or max(map(len, hosts)) < 2:
        return None
    if not (allreduce or allgather):
        return None
    local_rank, local_size, cross_rank = place.local_rank, place.local_size, place.cross_rank
    reducer = shm_setup.connect(
        local_rank, local_size, cross_rank, token, key, world, wait.total_seconds()
    )
    if reducer is None:
        return None
    leaders = len({len(ranks) for ranks in hosts}) > 1
    cross = None
    for index in range(1 if leaders else local_size):  # every rank makes every group, in order
        ranks = [host[index] for host in hosts]
        group = dist.new_group(ranks, backend="gloo", timeout=wait)
        if place.rank in ranks:
            cross = group
    return Hierarchy(reducer, cross, hosts, place.rank, leaders, allreduce, allgather)
