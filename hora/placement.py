"""Where ranks sit: a rank's coordinates, and the orders that give them.

At the bottom of the house, so that every side reads one type: a launcher's environment
(`hora.environment`), the engines that number ranks by host, the driver's `Reform`
(`hora.wire.protocol`) and the collectives (their state, the hierarchical data path) all hold a
`RankPlacement`; no bare tuple of coordinates travels between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class RankPlacement(NamedTuple):
    """Where one rank sits: its global, local (per host) and cross (host index) coordinates."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def placements(hosts: list[str]) -> list[RankPlacement]:
    """Placements for ranks given each rank's host, in rank order.

    Local ranks count the ranks on the same host; cross ranks number the hosts in order of their
    first rank, as Horovod does.
    """
    hosts_seen: list[str] = []
    for host in hosts:
        if host not in hosts_seen:
            hosts_seen.append(host)
    per_host = {host: [r for r, h in enumerate(hosts) if h == host] for host in hosts_seen}
    return [
        RankPlacement(
            rank=rank,
            size=len(hosts),
            local_rank=per_host[host].index(rank),
            local_size=len(per_host[host]),
            cross_rank=hosts_seen.index(host),
            cross_size=len(hosts_seen),
        )
        for rank, host in enumerate(hosts)
    ]


def host_order(hosts: list[str]) -> list[int]:
    """Slots (indexes into `hosts`) in rank order: the ranks of one host are contiguous, as
    Horovod and torchrun number them; hosts come in the order of their first slot, and slots
    keep their order within a host (so slot 0 stays rank 0)."""
    first: dict[str, int] = {}
    for slot, host in enumerate(hosts):
        first.setdefault(host, slot)
    return sorted(range(len(hosts)), key=lambda slot: (first[hosts[slot]], slot))


def joining_order(running: list[str], new: list[str]) -> list[int]:
    """New slots (indexes into `new`, their hosts) in the order of the ranks they get after the
    `running` ranks' (on these hosts, in rank order), who keep theirs: those on a running host
    first, host by host as its ranks come, then new hosts, so each host's ranks stay as
    contiguous as they can."""
    return [slot - len(running) for slot in host_order(running + new) if slot >= len(running)]


def hosts_of(places: Sequence[RankPlacement]) -> list[list[int]] | None:
    """The global ranks of each host, in host order, from every rank's placement (in rank
    order); None unless the ranks are numbered host by host, as every hora engine, horovodrun
    and torchrun number them (rank = ranks of earlier hosts + local rank)."""
    hosts: list[list[int]] = []
    for rank, place in enumerate(places):
        cross, local = place.cross_rank, place.local_rank
        if local == 0 and cross == len(hosts):
            hosts.append([])
        if not hosts or cross != len(hosts) - 1 or local != len(hosts[-1]):
            return None
        hosts[-1].append(rank)
        if place.local_size != places[hosts[-1][0]].local_size:
            return None
    if any(len(ranks) != places[ranks[0]].local_size for ranks in hosts):
        return None
    return hosts
