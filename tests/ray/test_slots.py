"""The Ray launcher's ledger of slots, without Ray: which are free, which count as room."""

from __future__ import annotations

from hora.engines.ray.slots import Slot, Slots


def test_free_slots_are_taken_lowest_first_and_count_where_their_bundle_is_placed():
    slots = Slots()
    assert slots.add_group("pg0", 4) == [0, 1, 2, 3]
    slots.ended(3, actor_alive=False)  # its actor lost with its node
    slots.ended(1, actor_alive=True)  # its worker died under a live actor
    placed = {"pg0": {"bundles_to_node_id": {0: "n1", 1: "n1", 2: "n2", 3: "gone"}}}
    assert slots.spare(placed.__getitem__, {"n1", "n2"}) == 1  # bundle 3 not reserved again
    placed["pg0"]["bundles_to_node_id"][3] = "n3"  # Ray reserved it on a returned node
    assert slots.spare(placed.__getitem__, {"n1", "n2", "n3"}) == 2
    assert slots.take(3) == ([3], [1])  # a new actor for slot 3; slot 1's actor runs again
    assert slots.free == {} and slots.spare(placed.__getitem__, {"n1"}) == 0
    assert slots.add_group("pg1", 2) == [4, 5] and slots.where[5] == Slot(1, 1)


def test_a_bundle_still_mapped_to_a_lost_node_is_stale_until_ray_lets_it_go():
    """Ray maps a lost node's bundles to it until its health checks declare it dead (seconds):
    an actor made there then dies at once, so the launcher waits for the mapping to change."""
    slots = Slots()
    slots.add_group("pg0", 4)
    placed = {"pg0": {"bundles_to_node_id": {0: "n1", 1: "n1", 2: "old", 3: "old"}}}
    assert slots.stale([2, 3], placed.__getitem__, {"n1", "new"}) == [2, 3]
    del placed["pg0"]["bundles_to_node_id"][2]  # declared dead: bundle 2 pending again
    placed["pg0"]["bundles_to_node_id"][3] = "new"  # bundle 3 reserved on the returned node
    assert slots.stale([2, 3], placed.__getitem__, {"n1", "new"}) == []
    assert slots.stale([0, 1], placed.__getitem__, {"new"}) == [0, 1]
