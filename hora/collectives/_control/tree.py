"""The negotiation tree: who each rank talks to, so that no rank does work per rank of the world.

Rank 0 decides every round (`negotiation.Coordinator`), but it hears only its children, and each
rank only its own: a `fanout`-ary tree over the ranks in heap order (rank r's children are
r*k+1 .. r*k+k), rooted at rank 0. A round's requests travel up, every rank relaying its
children's with its own (`relay.Relay`, which folds a subtree's identical cached round into one
report); rank 0's answer travels down, every rank forwarding the same bytes to its children
before it reads them. A world of `fanout` + 1 ranks or fewer is a star around rank 0, as it
always was; at 1,024 ranks and the default fan-out of 8 a frame crosses 4 ranks each way, and
each rank reads and writes at most 8 frames a round (Horovod's steady state is a bit-vector
allreduce: log2 N hops, no per-rank work at its coordinator; a tree of relays gives the same
shape without a collective per cycle on every rank).

The tree is a pure function of the world's size and the fan-out, so every rank computes it
alike; the fan-out is rank 0's `HORA_NEGOTIATION_FANOUT`, told to all by `init()`.
"""

from __future__ import annotations

import os

FANOUT_VAR = "HORA_NEGOTIATION_FANOUT"
DEFAULT_FANOUT = 8


def fanout_from_env() -> int:
    """HORA_NEGOTIATION_FANOUT (>= 2; default 8); a bad value is a ValueError naming it."""
    text = os.environ.get(FANOUT_VAR, "").strip()
    if not text:
        return DEFAULT_FANOUT
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{FANOUT_VAR} must be a whole number >= 2, got {text!r}") from None
    if value < 2:
        raise ValueError(f"{FANOUT_VAR} must be a whole number >= 2, got {value}")
    return value


class NegotiationTree:
    """A `fanout`-ary tree over ranks 0 .. size-1 in heap order, rooted at rank 0."""

    def __init__(self, size: int, fanout: int = DEFAULT_FANOUT) -> None:
        if size < 1 or fanout < 2:
            raise ValueError(f"a negotiation tree needs size >= 1, fanout >= 2: {size}, {fanout}")
        self.size = size
        self.fanout = fanout
        self._sizes: list[int] | None = None  # every rank's subtree size, worked out once

    def parent(self, rank: int) -> int | None:
        return None if rank == 0 else (rank - 1) // self.fanout

    def children(self, rank: int) -> range:
        first = rank * self.fanout + 1
        return range(min(first, self.size), min(first + self.fanout, self.size))

    def depth(self) -> int:
        """Hops from the deepest rank up to rank 0."""
        hops, rank = 0, self.size - 1
        while rank:
            rank = (rank - 1) // self.fanout
            hops += 1
        return hops

    def subtree_size(self, rank: int) -> int:
        """How many ranks `rank`'s subtree holds (itself included)."""
        sizes = self._sizes
        if sizes is None:
            sizes = [1] * self.size
            for r in range(self.size - 1, 0, -1):  # children come after their parent
                sizes[(r - 1) // self.fanout] += sizes[r]
            self._sizes = sizes
        return sizes[rank]

    def subtree(self, rank: int) -> list[int]:
        """The ranks of `rank`'s subtree, itself first, level by level."""
        found, level = [rank], [rank]
        while level:
            level = [c for r in level for c in self.children(r)]
            found.extend(level)
        return found
