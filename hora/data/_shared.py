"""Shared memory between a rank and its loader's workers: the units a worker read (Arrow tables,
mapped by every worker that needs their rows), and the batches the workers made, packed into
segments that a worker reuses once the rank says that nothing uses them any more.

Every segment is torch's (`UntypedStorage._new_shared`): a file descriptor whose name is unlinked
at once, passed over a socket when pickled, so nothing is left in /dev/shm when a process dies.
A segment the rank has mapped once is named by its number after that: the same pages, already
mapped on both sides, with no page faults and no descriptor to pass.
"""

from __future__ import annotations

import collections
import contextlib
import glob
import os
from typing import Any

import numpy as np
import pyarrow as pa

#: batches whose arrays together are smaller than this are pickled, not put in a segment
INLINE_BYTES = 64 << 10
_ALIGN = 64
#: free segments a worker keeps for its next batches (it has 2 in flight and the loop holds
#: one: its own come back about as fast as it needs them; more would hold a batch's bytes each)
KEEP_FREE = 2
#: batches the rank watches for their release; an older one is left to its holder
WATCHED = 64


def remove_names_left(pid: int | None, folder: str = "/dev/shm") -> None:
    """Unlink the segment names process `pid` (a worker, gone) left: torch names a new segment
    `torch_<pid>_<n>_<m>` and unlinks the name at once, so only a worker killed in between
    leaves one, which nothing would ever remove."""
    for path in glob.glob(os.path.join(folder, f"torch_{pid}_*")) if pid else ():
        with contextlib.suppress(OSError):
            os.unlink(path)


def _bytes(storage: Any) -> np.ndarray:
    import torch

    return torch.empty(0, dtype=torch.uint8).set_(storage).numpy()


def share_table(table: pa.Table) -> Any:
    """`table` written once into a new segment (Arrow's IPC stream)."""
    import torch

    counted = pa.MockOutputStream()
    with pa.ipc.new_stream(counted, table.schema) as writer:
        writer.write_table(table)
    storage = torch.UntypedStorage._new_shared(max(1, counted.size()))
    sink = pa.FixedSizeBufferWriter(pa.py_buffer(_bytes(storage)))
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return storage


def shared_table(storage: Any) -> pa.Table:
    """The table in a segment, mapped, not copied (it keeps the segment alive)."""
    return pa.ipc.open_stream(pa.py_buffer(_bytes(storage))).read_all()


def _torch_dtype(torch: Any, value: Any) -> Any:
    """The torch dtype of a numpy array or CPU tensor that a segment can hold, else None."""
    if isinstance(value, torch.Tensor):
        return value.dtype if value.device.type == "cpu" and not value.is_sparse else None
    if not isinstance(value, np.ndarray) or value.dtype == object:
        return None
    try:
        return torch.from_numpy(np.empty(0, dtype=value.dtype)).dtype
    except TypeError:  # a dtype torch has no tensor for: pickled as numpy
        return None


class Lender:
    """A worker's segments: each batch packed into one (a free one that fits, else a new one),
    lent to the rank until it frees or forgets it."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._free: list[tuple[int, Any]] = []
        self._lent: dict[int, Any] = {}
        self._known: set[int] = set()  # mapped by the rank
        self._dropped: list[int] = []  # freed ones this worker let go: the rank unmaps them
        self._next = 0
        self.made = 0  # segments made so far

    def pack(self, arrays: dict[str, Any]) -> tuple[Any, ...]:
        """What the rank needs to rebuild `arrays`: (segment, its storage when the rank has
        not mapped it, each value's place or the value itself, segments to unmap)."""
        torch = self._torch
        places: dict[str, Any] = {}
        offset = 0
        for name, value in arrays.items():
            dtype = _torch_dtype(torch, value)
            if dtype is None:
                continue
            places[name] = (dtype, tuple(value.shape), offset, isinstance(value, np.ndarray))
            size = value.nbytes if isinstance(value, np.ndarray) else value.numel() * dtype.itemsize
            offset += -(-size // _ALIGN) * _ALIGN
        dropped, self._dropped = self._dropped, []
        if offset < INLINE_BYTES:  # small: pickled, tensors as numpy where numpy has the type
            tensors = [k for k, p in places.items() if not p[3] and _numpy_can(arrays[k])]
            inline = {k: v.detach().numpy() if k in tensors else v for k, v in arrays.items()}
            return (None, None, inline, tensors, dropped)
        number, storage = self._segment(offset)
        for name, (dtype, shape, start, _) in places.items():
            value = arrays[name]
            view = _view(torch, storage, dtype, start, shape)
            if isinstance(value, np.ndarray):
                view.numpy()[...] = value
            else:
                with torch.no_grad():
                    view.copy_(value)
        others = {k: v for k, v in arrays.items() if k not in places}
        sent = None if number in self._known else storage
        self._known.add(number)
        return (number, sent, others, places, dropped)

    def _segment(self, size: int) -> tuple[int, Any]:
        fits = [f for f in self._free if self._capacity(f[1]) >= size]
        if fits:
            chosen = min(fits, key=lambda f: self._capacity(f[1]))
            self._free.remove(chosen)
        else:
            capacity = -(-size // (1 << 16)) * (1 << 16)
            chosen = (self._next, self._torch.UntypedStorage._new_shared(capacity))
            self._next += 1
            self.made += 1
        self._lent[chosen[0]] = chosen[1]
        return chosen

    @staticmethod
    def _capacity(storage: Any) -> int:
        return int(storage.nbytes())

    def free(self, numbers: list[int]) -> None:
        """The rank released these: reuse them (keeping KEEP_FREE at most)."""
        for number in numbers:
            if number in self._lent:
                self._free.append((number, self._lent.pop(number)))
        self._free.sort(key=lambda f: self._capacity(f[1]), reverse=True)
        while len(self._free) > KEEP_FREE:
            number, _ = self._free.pop()
            self._known.discard(number)
            self._dropped.append(number)

    def forget(self, numbers: list[int]) -> None:
        """The rank stopped watching these (their holder keeps them): not this worker's now."""
        for number in numbers:
            self._lent.pop(number, None)
            self._known.discard(number)


def _view(torch: Any, storage: Any, dtype: Any, start: int, shape: tuple[int, ...]) -> Any:
    """A tensor of `shape` over a segment's bytes from `start` (a multiple of the type's size)."""
    return torch.empty(0, dtype=dtype).set_(storage, start // dtype.itemsize, shape)


def _numpy_can(tensor: Any) -> bool:
    try:
        tensor.detach().numpy()
    except (TypeError, RuntimeError):  # bfloat16 and the like: pickled as a tensor
        return False
    return True


class Borrower:
    """The rank's side: the segments of each worker it has mapped, and the batches it handed
    out, watched until nothing uses their segment."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._mapped: dict[tuple[int, int], Any] = {}
        self._out: collections.deque[tuple[int, int]] = collections.deque()

    def unpack(self, worker: int, packed: tuple[Any, ...]) -> dict[str, Any]:
        torch = self._torch
        number, storage, others, places, dropped = packed
        for gone in dropped:
            self._mapped.pop((worker, gone), None)
        if number is None:  # pickled whole: the tensors a transform returned become tensors again
            return {k: torch.from_numpy(v) if k in places else v for k, v in others.items()}
        if storage is not None:
            self._mapped[(worker, number)] = storage
        storage = self._mapped[(worker, number)]
        self._out.append((worker, number))
        made = dict(others)
        for name, (dtype, shape, start, as_numpy) in places.items():
            tensor = _view(torch, storage, dtype, start, shape)
            made[name] = tensor.numpy() if as_numpy else tensor
        return made

    def released(self) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        """Segments nothing uses any more (free them), and ones watched too long (forget them),
        by worker."""
        use_count = self._torch._C._storage_Use_Count
        free: dict[int, list[int]] = collections.defaultdict(list)
        forget: dict[int, list[int]] = collections.defaultdict(list)
        kept: collections.deque[tuple[int, int]] = collections.deque()
        for key in self._out:
            storage = self._mapped.get(key)
            if storage is None:
                continue
            if use_count(storage._cdata) == 1:  # only this map holds it
                free[key[0]].append(key[1])
            else:
                kept.append(key)
        while len(kept) > WATCHED:
            key = kept.popleft()
            forget[key[0]].append(key[1])
            self._mapped.pop(key, None)
        self._out = kept
        return free, forget
