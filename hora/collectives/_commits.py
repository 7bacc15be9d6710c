"""A hvd.elastic state's commits (`hora.collectives.elastic.State`): their count, this host's
commit store (`hora.checkpoint`), which outlives the ranks, the freshest commit on any rank's
host for a new attempt, and rank 0's word at each commit on whether the run grows.
"""

from __future__ import annotations

from typing import Any

import torch

from hora import environment
from hora.checkpoint import Commit, CommitStore, remove_stale_commits
from hora.collectives import _driver
from hora.collectives._basics import local_rank, rank, size
from hora.collectives.objects import allgather_object, broadcast_object
from hora.collectives.ops import broadcast_


class Commits:
    """A state's commits: their index, this host's store, the freshest one anywhere."""

    def __init__(self) -> None:
        here = environment.current()
        self.index = 0  # commits made (or restored) so far in this run
        self.store = CommitStore(here.run_id) if here.run_id else None
        self.elastic = here.elastic
        self.resuming = here.attempt > 0  # only a later attempt finds commits of earlier ones

    def write(self, state: Any) -> None:
        """The next commit: into this host's store, by its local rank 0 (all hold the same)."""
        self.index += 1
        if self.store is not None and local_rank() == 0:
            self.store.write(Commit(self.index, size(), state))

    def freshest(self) -> Commit | None:
        """The freshest commit on any rank's host, the same on every rank; None when there is
        none (a first attempt, or a run outside hora)."""
        if self.store is None or not self.resuming:
            return None
        mine = None
        if local_rank() == 0:
            remove_stale_commits()
            mine = self.store.read()
        indexes = allgather_object(mine.number if mine else -1, name="elastic.freshest")
        best = max(indexes)
        if best < 0:
            return None
        holder = indexes.index(best)  # the lowest rank holding it
        commit = broadcast_object(mine if rank() == holder else None, holder, "elastic.restore")
        self.index = commit.number
        return commit

    def hosts_updated(self) -> int:
        """Rank 0's word, on every rank, on whether the driver asked the run to grow: 0 no,
        `GROW_BY_RESTART`, `GROW_IN_PLACE` (new ranks wait to join; `hora.elastic`)."""
        if not self.elastic:
            return 0
        flag = torch.tensor([_driver.growth_word(_driver.generation())], dtype=torch.int32)
        broadcast_(flag, 0, "elastic.hosts_updated")
        return int(flag.item())

    def finish(self) -> None:
        """The run's function returned on every rank: its commits on this host are no longer
        needed. The ranks first agree that all returned (one small broadcast): a rank lost at
        the very end fails it on the others, which then re-form and find the last commit (a
        restart finds it too) instead of training the run again from its start."""
        if self.elastic and size() > 1:
            broadcast_(torch.zeros(1, dtype=torch.int32), 0, "elastic.finished")
        if self.store is not None and local_rank() == 0:
            self.store.remove()
