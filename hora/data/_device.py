"""Batches to the GPU off the training thread: `pin_memory` and `device` of a loader.

A thread of the loader's own takes each batch as it is made, copies its tensors into a
page-locked buffer of a reused pool (one buffer per batch, found again once nothing uses it)
and, for a CUDA device, copies that buffer's tensors to the GPU on a side stream; it runs
`depth` batches ahead, so the loop's `next()` finds its batch on the device and its stream only
waits for that batch's copy (an event). torch's DataLoader pins in a thread too, into a fresh
page-locked copy of every batch, and leaves the copy to the loop.
"""

from __future__ import annotations

import queue
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

#: batches the thread makes ready ahead of the loop
DEPTH = 2
#: free page-locked buffers kept for the next batches (those of the batches in the queue, the
#: one the thread fills, the loop's and the one it just let go, and a spare)
KEEP_FREE = DEPTH + 3
_ALIGN = 64
_END = object()


def can_pin() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def pinned(nbytes: int) -> Any:
    """A page-locked buffer of `nbytes` bytes (torch's caching host allocator)."""
    import torch

    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).untyped_storage()


class PinnedPool:
    """Page-locked buffers, each lent for one batch and found again once no tensor uses it and
    the copy out of it (an event) is done. `allocate` makes one (tests give a pageable one)."""

    def __init__(self, allocate: Callable[[int], Any] | None = None) -> None:
        import torch

        self._use_count = torch._C._storage_Use_Count
        self._allocate = allocate or pinned
        self._free: list[Any] = []
        self._lent: list[tuple[Any, Any]] = []  # (buffer, event or None)
        self.made = 0  # buffers allocated so far

    def take(self, nbytes: int) -> Any:
        self._reclaim()
        fits = [b for b in self._free if b.nbytes() >= nbytes]
        if fits:
            buffer = min(fits, key=lambda b: b.nbytes())
            self._free.remove(buffer)
            return buffer
        self.made += 1
        return self._allocate(-(-max(1, nbytes) // (1 << 16)) * (1 << 16))

    @property
    def held(self) -> int:
        """The buffers this pool holds now, lent or free."""
        return len(self._free) + len(self._lent)

    def lend(self, buffer: Any, event: Any) -> None:
        self._lent.append((buffer, event))

    def _reclaim(self) -> None:
        lent = []
        for buffer, event in self._lent:
            done = event is None or event.query()
            if done and self._use_count(buffer._cdata) == 1:  # only this pool holds it
                self._free.append(buffer)
            else:
                lent.append((buffer, event))
        self._lent = lent
        self._free.sort(key=lambda b: b.nbytes(), reverse=True)
        del self._free[KEEP_FREE:]


def pin_batch(torch: Any, batch: dict[str, Any], pool: PinnedPool) -> tuple[dict[str, Any], Any]:
    """The batch with its CPU tensors copied into one buffer of `pool` (the rest as it is)."""
    tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor) and not v.is_cuda}
    places, size = {}, 0
    for name, value in tensors.items():
        places[name] = size
        size += -(-value.numel() * value.element_size() // _ALIGN) * _ALIGN
    buffer = pool.take(size)
    out = dict(batch)
    for name, value in tensors.items():
        start = places[name] // value.element_size()
        view = torch.empty(0, dtype=value.dtype).set_(buffer, start, value.shape)
        view.copy_(value)
        out[name] = view
    return out, buffer


class Feeder:
    """The thread that pins and copies: iterate it for (tag, batch on the device), in order;
    `close()` ends the thread (and `source` with it, in the thread)."""

    def __init__(
        self,
        source: Iterator[tuple[Any, dict[str, Any]]],
        device: Any,
        pool: PinnedPool,
        depth: int = DEPTH,
    ) -> None:
        import torch

        self._torch = torch
        self._source = source
        self._device = device
        self.pool = pool
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hora-data-to-device", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        torch = self._torch
        cuda = self._device is not None and self._device.type == "cuda"
        try:
            stream = torch.cuda.Stream(self._device) if cuda else None
            for tag, batch in self._source:
                pinned_batch, buffer = pin_batch(torch, batch, self.pool)
                event = None
                if stream is not None:
                    with torch.cuda.stream(stream):
                        moved = {k: _to(v, self._device) for k, v in pinned_batch.items()}
                        event = torch.cuda.Event()
                        event.record(stream)
                    del pinned_batch  # the device copies are what the loop gets
                else:
                    moved = pinned_batch
                self.pool.lend(buffer, event)
                del buffer, batch
                if not self._put((tag, moved, event)):
                    return
            self._put(_END)
        except BaseException as e:  # raised in the loop
            self._put(e)
        finally:
            close = getattr(self._source, "close", None)
            if close is not None:
                close()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[tuple[Any, dict[str, Any]]]:
        torch = self._torch
        while True:
            item = self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            tag, batch, event = item
            if event is not None:
                current = torch.cuda.current_stream(self._device)
                current.wait_event(event)
                for value in batch.values():
                    if isinstance(value, torch.Tensor) and value.is_cuda:
                        value.record_stream(current)  # its memory waits for the loop's kernels
            yield tag, batch

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
        self._thread.join()


def _to(value: Any, device: Any) -> Any:
    if hasattr(value, "to") and hasattr(value, "is_cuda"):
        return value.to(device, non_blocking=True)
    return value


def to_device(
    batches: Iterator[tuple[Any, dict[str, Any]]],
    device: Any,
    pin: bool,
    pool: Callable[[], PinnedPool],
) -> Iterable[tuple[Any, dict[str, Any]]]:
    """`batches` ((tag, tensors) pairs) pinned (`pin`) and on `device` (None: where they are),
    made ready by a Feeder thread (with the buffers of `pool()`) where there is anything to
    do; without CUDA, `pin` warns and the batches pass as they are."""
    import torch

    target = torch.device(device) if device is not None else None
    cuda = target is not None and target.type == "cuda"
    if not cuda and not pin:
        return batches if target is None else _moved(batches, target)
    if not can_pin():
        if cuda:
            raise RuntimeError(f"device={device!r} but torch finds no CUDA device here")
        warnings.warn(
            "pin_memory=True but no CUDA device is here: batches stay in pageable memory",
            stacklevel=4,
        )
        return batches if target is None else _moved(batches, target)
    return Feeder(batches, target, pool())


def _moved(
    batches: Iterator[tuple[Any, dict[str, Any]]], target: Any
) -> Iterator[tuple[Any, dict[str, Any]]]:
    for tag, batch in batches:
        yield tag, {k: _to(v, target) for k, v in batch.items()}
