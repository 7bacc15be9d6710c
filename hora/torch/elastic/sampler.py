"""ElasticSampler: shard a dataset by rank, and resume an epoch after a resize with exactly the
samples no rank has processed.

Ranks step in lockstep (every step is a collective), so after `record_batch(batch_idx,
batch_size)` each rank knows that every rank has processed the first `(batch_idx + 1) *
batch_size` indices of its own shard, and so the whole set processed this epoch. That set is
the sampler's state (`state_dict()`), the same on every rank: a commit made by any survivor
holds what the lost ranks had done too, and a new world re-partitions the rest.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator, Sized
from typing import Any

import torch.utils.data

from hora.collectives import rank, size

__all__ = ["ElasticSampler", "partition"]


def partition(
    remaining: list[int], replicas: int, shuffle: bool, seed: int
) -> tuple[list[int], int]:
    """The not-yet-processed indices in the order they are dealt (shuffled with `seed`, padded
    by repeating the first ones so that every rank gets as many), and each rank's count.
    Rank r's shard is `order[r::replicas]`."""
    order = list(remaining)
    if shuffle:
        random.Random(seed).shuffle(order)
    per_rank = math.ceil(len(order) / replicas)
    order += list(itertools.islice(itertools.cycle(order), per_rank * replicas - len(order)))
    return order, per_rank


class ElasticSampler(torch.utils.data.Sampler[int]):
    """Each rank gets every `size()`-th of the not-yet-processed indices, padded to equal length.

    Call `record_batch(batch_idx, batch_size)` after each batch (`batch_idx` counted from the
    start of this iteration) and commit the state: after a reset or a resize the epoch resumes
    with only the samples no rank has processed. `set_epoch` starts a new epoch (reshuffled with
    `seed + epoch`).
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        #: processed before this partition (plus what `record_indices` added on this rank)
        self.processed_indices: set[int] = set()
        #: how many of its shard every rank has processed since this partition was made
        self.processed_num = 0
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.processed_indices = set()
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Every rank has processed the first `batch_idx + 1` batches of its shard."""
        self.processed_num = max(
            self.processed_num, min((batch_idx + 1) * batch_size, self.num_samples)
        )

    def record_indices(self, indices: list[int]) -> None:
        """This rank processed `indices` (united with the other ranks' at the next sync)."""
        self.processed_indices.update(indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        start = batch_idx * batch_size
        return self.indices[start : min(start + batch_size, len(self.indices))]

    def processed_everywhere(self) -> set[int]:
        """Every index some rank has processed this epoch, as far as this rank knows."""
        done = set(self.processed_indices)
        for shard in range(self.num_replicas):
            done.update(
                self.remaining_indices[shard : self.total_size : self.num_replicas][
                    : self.processed_num
                ]
            )
        return done

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_indices": self.processed_everywhere()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.processed_num = 0
        self.reset()

    def reset(self) -> None:
        """Re-partition what no rank has processed over the current world."""
        self.processed_indices = self.processed_everywhere()
        self.processed_num = 0
        self.num_replicas = size()
        self.rank = rank()
        remaining = [i for i in range(len(self.dataset)) if i not in self.processed_indices]
        self.remaining_indices, self.num_samples = partition(
            remaining, self.num_replicas, self.shuffle, self.seed + self.epoch
        )
        self.total_size = self.num_samples * self.num_replicas
        self.indices = self.remaining_indices[self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
