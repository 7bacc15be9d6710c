"""Allreduce among the ranks of one host through shared memory instead of gloo's TCP loopback.

gloo moves a same-host allreduce through loopback TCP: on a 2-core host 1 MB takes about 2 ms.
Here the ranks exchange their data through one shared segment and meet at barriers (one byte to
and from each peer over authenticated Unix sockets). Small buffers are reduced whole by every
rank; larger ones as a pipelined reduce-scatter and allgather, each rank reducing its share
(`LocalReducer` says how, and why every rank gets bitwise the same result either way).

For a hierarchical allreduce across hosts, `LocalReducer.allreduce(..., between=)` hands each
piece of this rank's share, reduced within the host, to the caller before the others copy it
(where it would be reduced across hosts), and `shares` says which range of the buffer that is.

Used for CPU tensors of the global process set when every rank is on this host (a single
machine, or `local[N]`-style runs); anything else, and `HORA_SHM=0`, keeps gloo. Setting it up
(the segment, the mesh of sockets, every rank agreeing) is `shm_setup.connect`.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import socket
from collections.abc import Callable
from typing import Any

import torch
from torch._utils import _unflatten_dense_tensors

from hora.collectives._common import Average, Max, Min, Product, Sum
from hora.collectives._data.dtypes import scale_

SLOT_BYTES = 4 << 20  # per rank and half: 2 ranks map 16 MB in all
PIECE_BYTES = 512 << 10  # of a share per step: small enough to be read back from cache
WHOLE_BYTES = 4 << 20  # operand bytes up to which every rank reduces all of a buffer itself
GRAIN = 32768  # elements torch gives one intra-op thread at least: a piece feeds them all
ALIGN_BYTES = 64  # shares start on cache lines: ranks writing neighbouring shares never share one
MAX_LAYOUTS = 64  # bucket layouts whose slot views are kept, per half
_REDUCE: dict[int, Callable[..., torch.Tensor]] = {
    Sum: torch.add,
    Average: torch.add,
    Min: torch.minimum,
    Max: torch.maximum,
    Product: torch.mul,
}


def shares(numel: int, itemsize: int, size: int) -> list[tuple[int, int]]:
    """The contiguous ranges of a flat buffer of `numel` elements that each rank reduces, in
    rank order, cut on cache lines."""
    align = max(1, ALIGN_BYTES // itemsize)
    bounds = [numel * k // size // align * align for k in range(size)] + [numel]
    return list(itertools.pairwise(bounds))


def whole_bytes(size: int) -> int:
    """The largest buffer every rank of `size` reduces whole: one slot, and the reduction each
    rank repeats (size - 1 operands) under WHOLE_BYTES."""
    return min(SLOT_BYTES, WHOLE_BYTES // max(size - 1, 1))


def piece_elements(itemsize: int, size: int, across: bool = False) -> int:
    """How much of each share goes through per step: PIECE_BYTES, or a grain for every
    intra-op thread (this rank's torch threads), as long as every share's piece fits a slot.
    `across`: each piece also crosses the network (`allreduce(between=)`), where a step costs
    a round trip: as much as fits a slot."""
    piece = SLOT_BYTES if across else max(PIECE_BYTES, torch.get_num_threads() * GRAIN * itemsize)
    return min(piece, SLOT_BYTES // size) // ALIGN_BYTES * ALIGN_BYTES // itemsize


class LocalReducer:
    """The shared segment and the barrier sockets of one set of same-host ranks (a host with
    one rank has neither: every operation is then a copy at most).

    The segment holds one slot per rank in each of two halves, used by turns, one per step.

    Small buffers are reduced whole: every rank copies its buffer into its slot, the ranks meet
    at a barrier (one byte to and from each peer over authenticated Unix sockets), and every
    rank reduces all slots itself. One barrier; each rank repeats the whole reduction.

    Larger ones are split into one contiguous share per rank (`shares`, each reduced by its
    rank only: a reduce-scatter, then an allgather) and go through in steps, a piece of every
    share at a time, placed at `k * piece` for share k in the slots. A step: every rank copies
    its pieces of the others' shares into its slot; a barrier; every rank reduces its own piece
    (its own input read where it lies, the others' from their slots) into its own slot, where
    its input piece would be; then copies out the previous step's pieces of every share, which
    that barrier has made whole. One barrier per step and one to finish; each rank reads its
    input once, reduces 1/size of it, and the peers read a piece while it is in cache.

    Both ways reduce every element in rank order, so every rank gets bitwise the same result,
    the same either way. A half may be reused two steps later: every access to it in step k is
    over before its rank reaches the barrier that ends step k + 1 (the copy out of step k runs
    in step k + 1), and the next writes come in step k + 2 (inputs before its barrier, results
    after it) from ranks past that barrier. `allgather` and `broadcast` keep the same rule:
    a step writes before its barrier and reads after it.
    """

    def __init__(
        self, segment: mmap.mmap | None, index: int, size: int, peers: list[socket.socket]
    ):
        self._segment = segment
        self._bytes = torch.frombuffer(segment, dtype=torch.uint8) if segment is not None else None
        self._index = index
        self._size = size
        self._peers = peers  # one socket per other rank, in rank order
        self._steps = 0  # steps so far: which half the next one uses
        self._slots: dict[tuple[int, torch.dtype], list[torch.Tensor]] = {}  # viewed as dtype
        self._piece_views: dict[tuple[int, torch.dtype, int], list[list[torch.Tensor]]] = {}
        # (half, layout) -> views of this rank's slot shaped like a bucket's tensors
        self._views: dict[tuple[int, Any], list[torch.Tensor]] = {}

    def _half(self, dtype: torch.dtype) -> tuple[int, list[torch.Tensor]]:
        """The next step's half of the segment, and every rank's slot in it viewed as `dtype`."""
        half = self._steps % 2
        self._steps += 1
        slots = self._slots.get((half, dtype))
        if slots is None:
            assert self._bytes is not None, "a host of one rank has no segment"
            first = half * self._size
            slots = self._slots[(half, dtype)] = [
                self._bytes[k * SLOT_BYTES : (k + 1) * SLOT_BYTES].view(dtype)
                for k in range(first, first + self._size)
            ]
        return half, slots

    def _barrier(self) -> None:
        for peer in self._peers:
            peer.sendall(b"\1")
        for peer in self._peers:
            if not peer.recv(1):
                raise ConnectionError("a same-host peer closed its shared-memory barrier")

    def _reduce(
        self, out: torch.Tensor, operands: list[torch.Tensor], op: int, scale: float
    ) -> None:
        """`out` = the operands reduced in rank order, then scaled (Average sums: the caller
        gives 1/size in `scale`)."""
        reduce = _REDUCE[op]
        if len(operands) == 1:
            out.copy_(operands[0])  # a host of one rank
        else:
            reduce(operands[0], operands[1], out=out)
        for other in operands[2:]:
            reduce(out, other, out=out)
        scale_(out, scale)

    def allreduce(
        self,
        src: torch.Tensor,
        dst: torch.Tensor,
        op: int,
        scale: float = 1.0,
        between: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        """`dst` = the reduction of every rank's `src` (contiguous, same dtype and size; `dst`
        may be `src`), times `scale`. `between(piece)`, if given, is called on each piece of
        this rank's share (`shares`) once it is reduced, before it is scaled and the others copy
        it: what a hierarchical allreduce would do there is reduce it across hosts."""
        src, dst = src.view(-1), dst.view(-1)
        if self._size == 1:
            self._reduce(dst, [src], op, 1.0 if between else scale)
            if between is not None:
                between(dst)
                scale_(dst, scale)
            return
        if src.nbytes <= whole_bytes(self._size) and not between:
            _, slots = self._half(src.dtype)
            slots[self._index][: src.numel()].copy_(src)
            self._reduce_whole(slots, dst, op, scale)
            return
        # Every rank fails alike, before any waits for another, where the op lacks the dtype
        # (complex Max): in the steps only the rank of a share reduces it.
        _REDUCE[op](src[:0], src[:0])
        piece = piece_elements(src.element_size(), self._size, across=between is not None)
        # every share cut into pieces, all views made by one split: [share][step]
        lengths = [
            [min(piece, hi - at) for at in range(lo, hi, piece)]
            for lo, hi in shares(src.numel(), src.element_size(), self._size)
        ]
        src_parts = _regroup(src.split(list(itertools.chain(*lengths))), lengths)
        dst_parts = (
            src_parts
            if dst.data_ptr() == src.data_ptr()
            else _regroup(dst.split(list(itertools.chain(*lengths))), lengths)
        )
        me = self._index
        copy_out: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        for step in range(max(len(parts) for parts in src_parts)):
            pieces = self._pieces(src.dtype, piece)  # [rank][share]: where share k's piece lies
            publish, gather = _step_copies(src_parts, dst_parts, lengths, pieces, me, step)
            if publish[0]:
                torch._foreach_copy_(*publish)
            self._barrier()
            if step < len(src_parts[me]):
                mine, n = src_parts[me][step], lengths[me][step]
                out = _first(pieces[me][me], n)
                operands = [mine if j == me else _first(p[me], n) for j, p in enumerate(pieces)]
                self._reduce(out, operands, op, 1.0 if between else scale)
                if between is not None:
                    between(out)
                    scale_(out, scale)
            if copy_out is not None:
                torch._foreach_copy_(*copy_out)
            copy_out = gather
        self._barrier()
        assert copy_out is not None
        torch._foreach_copy_(*copy_out)

    def _pieces(self, dtype: torch.dtype, piece: int) -> list[list[torch.Tensor]]:
        """The next step's half of the segment as pieces: [rank][share], `piece` elements each."""
        half, slots = self._half(dtype)
        key = (half, dtype, piece)
        found = self._piece_views.get(key)
        if found is None:
            if len(self._piece_views) >= MAX_LAYOUTS:
                self._piece_views.clear()
            found = self._piece_views[key] = [
                list(slot[: piece * self._size].split(piece)) for slot in slots
            ]
        return found

    def _reduce_whole(
        self, slots: list[torch.Tensor], out: torch.Tensor, op: int, scale: float
    ) -> None:
        """A buffer already in this rank's slot: once every rank's is there, reduce it all."""
        self._barrier()
        n = out.numel()
        self._reduce(out, [slot[:n] for slot in slots], op, scale)

    def allgather(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """`dst` = every rank's `src` (flat bytes, the same count on every rank), in rank order,
        in steps of a slot: each rank writes its part into its slot, and after the barrier
        copies every slot out."""
        n = src.numel()
        if self._size == 1:
            dst.copy_(src)
            return
        for at in range(0, n, SLOT_BYTES):
            count = min(SLOT_BYTES, n - at)
            _, slots = self._half(torch.uint8)
            slots[self._index][:count].copy_(src[at : at + count])
            self._barrier()
            torch._foreach_copy_(
                [dst[k * n + at : k * n + at + count] for k in range(self._size)],
                [slot[:count] for slot in slots],
            )

    def broadcast(self, buf: torch.Tensor, root: int) -> None:
        """`buf` (flat bytes) = the one of rank `root` (an index among this reducer's ranks), in
        steps of a whole half of the segment: the root writes it, the others copy it out."""
        if self._size == 1:
            return
        assert self._bytes is not None
        span = self._size * SLOT_BYTES
        for at in range(0, buf.numel(), span):
            count = min(span, buf.numel() - at)
            half = self._steps % 2
            self._steps += 1
            shared = self._bytes[half * span : half * span + count]
            if self._index == root:
                shared.copy_(buf[at : at + count])
            self._barrier()
            if self._index != root:
                buf[at : at + count].copy_(shared)

    def fits(self, nbytes: int) -> bool:
        return nbytes <= SLOT_BYTES

    def allreduce_from_(
        self, tensors: list[torch.Tensor], layout: Any, out: torch.Tensor, op: int, scale: float
    ) -> None:
        """Reduce `tensors` (one dtype, `fits` their bytes) into the flat `out`, times `scale`:
        they are copied straight into this rank's slot (views made once per layout and half),
        which saves the copy into a fusion buffer and from there into the slot."""
        half, slots = self._half(out.dtype)
        views = self._views.get((half, layout))
        if views is None:
            if len(self._views) >= 2 * MAX_LAYOUTS:
                self._views.clear()
            mine = slots[self._index][: out.numel()]
            views = self._views[(half, layout)] = list(_unflatten_dense_tensors(mine, tensors))
        torch._foreach_copy_(views, tensors)
        self._reduce_whole(slots, out, op, scale)

    def close(self) -> None:
        for peer in self._peers:
            peer.close()
        self._slots.clear()
        self._piece_views.clear()
        self._views.clear()
        self._bytes = None  # release the export before closing
        if self._segment is not None:
            with contextlib.suppress(BufferError):
                self._segment.close()


def _first(view: torch.Tensor, n: int) -> torch.Tensor:
    """The first `n` elements of a slot's piece (a view is made only for a short last one)."""
    return view if n == view.numel() else view[:n]


def _regroup(parts: tuple[torch.Tensor, ...], lengths: list[list[int]]) -> list[list[torch.Tensor]]:
    """Split's flat tuple of pieces, grouped again as `lengths` is: [share][step]."""
    grouped, start = [], 0
    for share in lengths:
        grouped.append(list(parts[start : start + len(share)]))
        start += len(share)
    return grouped


_Copies = tuple[list[torch.Tensor], list[torch.Tensor]]


def _step_copies(
    src_parts: list[list[torch.Tensor]],
    dst_parts: list[list[torch.Tensor]],
    lengths: list[list[int]],
    pieces: list[list[torch.Tensor]],
    me: int,
    step: int,
) -> tuple[_Copies, _Copies]:
    """One pipeline step's copies: this rank's pieces of the others' shares into the segment
    (publish), and every reduced piece out of it into `dst` (gather)."""
    publish: _Copies = ([], [])
    gather: _Copies = ([], [])
    for k, parts in enumerate(src_parts):
        if step < len(parts):  # a share may have a piece fewer than the others
            n = lengths[k][step]
            gather[0].append(dst_parts[k][step])
            gather[1].append(_first(pieces[k][k], n))
            if k != me:
                publish[0].append(_first(pieces[me][k], n))
                publish[1].append(parts[step])
    return publish, gather
