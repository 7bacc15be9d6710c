"""Where ranks sit (`hora.placement`): coordinates from hosts, the order of slots and of joiners,
and whether a world's ranks are numbered host by host (the hierarchical data path's test)."""

from __future__ import annotations

from hora.placement import RankPlacement, host_order, hosts_of, joining_order, placements


def test_placements_across_hosts() -> None:
    places = placements(["a", "b", "a", "b", "c"])
    assert [(p.local_rank, p.local_size, p.cross_rank) for p in places] == [
        (0, 2, 0), (0, 2, 1), (1, 2, 0), (1, 2, 1), (0, 1, 2),
    ]  # fmt: skip
    assert {(p.size, p.cross_size) for p in places} == {(5, 3)}
    assert [p.rank for p in places] == [0, 1, 2, 3, 4]


def test_ranks_are_numbered_host_by_host() -> None:
    """Spark schedules tasks round-robin over executors; ranks must not follow that order."""
    slots = ["h1", "h2", "h1", "h2", "h3"]
    order = host_order(slots)
    assert order == [0, 2, 1, 3, 4]
    places = placements([slots[slot] for slot in order])
    assert [(p.local_rank, p.local_size, p.cross_rank) for p in places] == [
        (0, 2, 0), (1, 2, 0), (0, 2, 1), (1, 2, 1), (0, 1, 2),
    ]  # fmt: skip
    assert host_order(["a", "a"]) == [0, 1]  # one host: slot order


def test_joining_ranks_follow_the_running_ones_host_by_host() -> None:
    """New slots on a running host come first (that host's ranks as contiguous as they can
    be), new hosts after, in the order of their slots."""
    running = ["a", "a", "b"]
    assert joining_order(running, ["c", "b", "c", "a"]) == [3, 1, 0, 2]
    assert joining_order([], ["x", "y", "x"]) == [0, 2, 1]


def test_hosts_of_ranks_numbered_host_by_host() -> None:
    assert hosts_of(placements(["a", "a", "b", "b"])) == [[0, 1], [2, 3]]
    assert hosts_of(placements(["a", "a", "a", "b"])) == [[0, 1, 2], [3]]  # uneven hosts
    assert hosts_of(placements(["a"])) == [[0]]


def test_hosts_of_refuses_ranks_interleaved_across_hosts() -> None:
    """Round-robin numbering (what `host_order` prevents) leaves no host's ranks contiguous."""
    assert hosts_of(placements(["a", "b", "a", "b"])) is None


def test_hosts_of_refuses_coordinates_that_disagree() -> None:
    """A launcher's coordinates that cannot be true (a host's ranks that count a different
    local size, a host whose ranks are fewer than its local size) are not trusted."""
    disagree = [RankPlacement(0, 3, 0, 2, 0, 2), RankPlacement(1, 3, 1, 3, 0, 2)]
    assert hosts_of([*disagree, RankPlacement(2, 3, 0, 1, 1, 2)]) is None
    short = [RankPlacement(0, 2, 0, 2, 0, 2), RankPlacement(1, 2, 0, 1, 1, 2)]
    assert hosts_of(short) is None
