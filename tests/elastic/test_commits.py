"""The rank side's arithmetic, without ranks: the host's commit store, and ElasticSampler's
global state across resizes."""

from __future__ import annotations

import os
import time

import pytest
import torch

from hora.checkpoint import Commit, CommitStore, remove_host_commits, remove_stale_commits
from hora.torch.elastic import sampler as sampler_module
from hora.torch.elastic.sampler import ElasticSampler, partition


def test_a_commit_replaces_the_last_one_whole_and_outlives_its_writer(tmp_path, monkeypatch):
    monkeypatch.setattr("hora.checkpoint._commits.SHARED_MEMORY", str(tmp_path))
    store = CommitStore("run-a")
    assert store.read() is None
    store.write(Commit(1, 4, {"w": torch.ones(3)}))
    store.write(Commit(2, 4, {"w": torch.full((3,), 2.0)}))
    again = CommitStore("run-a").read()  # another process of the same run, later
    assert again is not None and (again.number, again.size) == (2, 4)
    assert torch.equal(again.state["w"], torch.full((3,), 2.0))
    assert [p.name for p in store.folder.iterdir()] == ["commit.pt"]  # no temp file left
    assert oct(store.folder.stat().st_mode & 0o777) == "0o700"
    remove_host_commits("run-a")
    assert not store.folder.exists()


def test_stale_stores_of_dead_runs_go_fresh_ones_stay(tmp_path, monkeypatch):
    monkeypatch.setattr("hora.checkpoint._commits.SHARED_MEMORY", str(tmp_path))
    old, new = CommitStore("old"), CommitStore("new")
    for store in (old, new):
        store.write(Commit(1, 1, {}))
    day_ago = time.time() - 2 * 24 * 3600
    os.utime(old.folder, (day_ago, day_ago))
    remove_stale_commits()
    assert not old.folder.exists() and new.read() is not None


def world(monkeypatch, rank: int, size: int) -> None:
    monkeypatch.setattr(sampler_module, "rank", lambda: rank)
    monkeypatch.setattr(sampler_module, "size", lambda: size)


def test_partition_deals_every_index_once_and_pads_only_to_equal_shards():
    order, per_rank = partition(list(range(10)), 4, shuffle=True, seed=3)
    assert per_rank == 3 and len(order) == 12
    assert sorted(order[:10]) == list(range(10)) and order[10:] == order[:2]
    assert partition(list(range(8)), 4, shuffle=False, seed=0) == (list(range(8)), 2)


@pytest.mark.parametrize(("before", "after"), [(4, 2), (2, 4), (3, 1)])
def test_a_commit_of_any_rank_resumes_the_epoch_with_exactly_the_samples_left(
    monkeypatch, before, after
):
    """`before` ranks process 2 batches of 3 each; rank 0's state (any rank's: they are the
    same) resumes on `after` ranks, which together process each remaining sample once."""
    samples = 48
    shards = []
    for rank in range(before):
        world(monkeypatch, rank, before)
        s = ElasticSampler(range(samples), seed=5)
        s.set_epoch(2)
        shards.append(list(s))
        s.record_batch(0, 3)
        s.record_batch(1, 3)
        if rank == 0:
            committed = s.state_dict()
        assert s.state_dict() == committed
    done = {i for shard in shards for i in shard[:6]}
    assert committed == {"epoch": 2, "processed_indices": done}
    resumed = []
    for rank in range(after):
        world(monkeypatch, rank, after)
        s = ElasticSampler(range(samples), seed=5)
        s.load_state_dict(committed)
        resumed.append(list(s))
    rest = [i for shard in resumed for i in shard]
    assert sorted(rest) == sorted(set(range(samples)) - done)  # none twice, none skipped


def test_a_sharded_state_re_forms_in_place_only_with_reshard(tmp_path, monkeypatch, caplog):
    """FSDP2's mesh is the world it was made in: without `reshard=` the state says it cannot
    re-form in place, and how to let it."""
    import torch.distributed as dist

    from hora.torch.elastic import TorchState
    from tests.elastic import _jobs

    monkeypatch.setenv("HORA_ELASTIC", "1")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        net = _jobs._shard(_jobs.model(), 1)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        assert not TorchState(net, opt, checkpoint_dir=tmp_path).reforms_in_place()
        assert "pass reshard=fn" in caplog.text
        state = TorchState(net, opt, checkpoint_dir=tmp_path, reshard=lambda size: (net, opt))
        assert state.reforms_in_place()
    finally:
        dist.destroy_process_group()


def test_a_torch_distributed_error_heals_only_where_the_world_re_forms():
    """FSDP2's and DCP's collectives fail with torch.distributed's errors, not Horovod's: under
    an in-place run they wait for the driver's word too; a user's own error never does."""
    import torch.distributed as dist

    from hora.collectives import HorovodInternalError
    from hora.collectives.elastic import _may_heal

    def raised(error: Exception) -> Exception:
        try:
            raise error
        except Exception as caught:
            return caught

    assert _may_heal(HorovodInternalError("lost"), reformable=False)
    assert _may_heal(dist.DistError("lost"), reformable=True)
    assert not _may_heal(dist.DistError("lost"), reformable=False)
    assert not _may_heal(raised(RuntimeError("shape mismatch")), reformable=True)
