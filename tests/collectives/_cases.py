"""Conformance cases of the collective engine, run inside real ranks.

`run_all()` runs every case on the rank it is called on and returns {case: "ok" | error text};
one hora job per world size runs them all, and the tests assert per case. Each case computes the
expected values from the rank and the world size on its own, so nothing is hard-coded for a
particular size.
"""

from __future__ import annotations

import hashlib
import os
import time
import traceback
import warnings
from collections.abc import Callable

import torch

import hora.torch as hvd
from hora.collectives._control import state as _state
from hora.collectives._data import shm as _shm
from hora.collectives._data import transports as _backends
from hora.collectives._data.dtypes import as_bytes

CASES: dict[str, Callable[[int, int], None]] = {}


def case(fn: Callable[[int, int], None]) -> Callable[[int, int], None]:
    CASES[fn.__name__] = fn
    return fn


def expect_raises(exc: type[BaseException], fn: Callable[[], object], match: str = "") -> str:
    try:
        fn()
    except exc as e:
        assert match in str(e), f"{type(e).__name__}({e}) lacks {match!r}"
        return str(e)
    raise AssertionError(f"{exc.__name__} not raised")


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.allclose(a.double(), b.double(), rtol=1e-3, atol=1e-3), (a, b)


# ----- basics ------------------------------------------------------------------------------------
@case
def basics(r: int, n: int) -> None:
    assert hvd.is_initialized()
    assert (hvd.rank(), hvd.size()) == (r, n)
    assert 0 <= hvd.local_rank() < hvd.local_size() and 0 <= hvd.cross_rank() < hvd.cross_size()
    if hvd.cross_size() == 1:
        assert (hvd.local_rank(), hvd.local_size(), hvd.cross_rank()) == (r, n, 0)
    if hvd.is_homogeneous():  # ranks numbered host by host, as horovodrun and torchrun do
        assert r == hvd.cross_rank() * hvd.local_size() + hvd.local_rank()
    hvd.init()  # idempotent
    assert hvd.size() == n
    assert (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 2, 3, 4, 5)
    assert issubclass(hvd.HorovodInternalError, RuntimeError)
    assert hvd.gloo_built() and hvd.gloo_enabled()
    assert not hvd.mpi_built() and not hvd.mpi_enabled()
    assert isinstance(hvd.nccl_built(), int)
    assert hvd.ddl_built() is False and hvd.ccl_built() is False
    assert isinstance(hvd.cuda_built(), bool) and isinstance(hvd.rocm_built(), bool)
    expect_raises(ValueError, hvd.mpi_threads_supported)
    assert hvd.global_process_set.process_set_id == 0
    assert hvd.global_process_set.ranks == list(range(n))
    assert hvd.global_process_set.size() == n and hvd.global_process_set.rank() == r


# ----- allreduce ---------------------------------------------------------------------------------
@case
def allreduce_ops(r: int, n: int) -> None:
    x = torch.tensor([r + 1.0, -(r + 1.0), 2.0])
    ranks = torch.arange(1, n + 1, dtype=torch.float32)
    close(hvd.allreduce(x), torch.tensor([ranks.mean(), -ranks.mean(), 2.0]))
    close(hvd.allreduce(x, op=hvd.Sum), torch.tensor([ranks.sum(), -ranks.sum(), 2.0 * n]))
    close(hvd.allreduce(x, op=hvd.Min), torch.tensor([1.0, -float(n), 2.0]))
    close(hvd.allreduce(x, op=hvd.Max), torch.tensor([float(n), -1.0, 2.0]))
    close(
        hvd.allreduce(x, op=hvd.Product),
        torch.tensor([ranks.prod(), (-ranks).prod(), 2.0**n]),
    )
    assert torch.equal(x, torch.tensor([r + 1.0, -(r + 1.0), 2.0])), "out of place changed input"


@case
def allreduce_scaling(r: int, n: int) -> None:
    x = torch.full((4,), float(r + 1))
    total = n * (n + 1) / 2
    got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    close(got, torch.full((4,), total))
    got = hvd.allreduce(x, op=hvd.Average, prescale_factor=3.0)
    close(got, torch.full((4,), 3.0 * total / n))
    # Integers: scaled in float64 and truncated back.
    xi = torch.full((3,), r + 1, dtype=torch.int32)
    close(hvd.allreduce(xi), torch.full((3,), int(total / n), dtype=torch.int32))
    got = hvd.allreduce(xi, op=hvd.Sum, prescale_factor=0.5)
    expected = sum(int((k + 1) * 0.5) for k in range(n))
    close(got, torch.full((3,), expected, dtype=torch.int32))


def off(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("0", "false", "no", "off")


@case
def allreduce_path(r: int, n: int) -> None:
    """Shared memory on one host, and within each host on several (the hierarchical path, where
    some host runs more than one rank), unless HORA_SHM=0 (or, on several hosts,
    HOROVOD_HIERARCHICAL_ALLREDUCE=0) keeps gloo."""
    before = dict(_backends.stats)
    hvd.allreduce(torch.ones(8), name="path")
    shm = _backends.stats["shm_allreduce_calls"] - before.get("shm_allreduce_calls", 0)
    on_gpu = torch.empty(0).is_cuda  # the CUDA rerun of these cases (tests/gpu)
    hosts = hvd.cross_size()
    flat = hosts > 1 and (off("HOROVOD_HIERARCHICAL_ALLREDUCE") or n == hosts)
    assert shm == (0 if off("HORA_SHM") or on_gpu or flat else 1), shm
    hierarchical = _backends.stats["hierarchical_allreduce_calls"]
    assert hierarchical - before.get("hierarchical_allreduce_calls", 0) == (shm if hosts > 1 else 0)
    assert _backends.stats["allreduce_calls"] - before.get("allreduce_calls", 0) == 1


@case
def allreduce_large_and_identical(r: int, n: int) -> None:
    """Larger than a shared-memory slot (chunked), odd-sized, and bitwise equal on every rank."""
    count = 2 * _shm.SLOT_BYTES // 8 + 1234  # float64: two full chunks and a ragged one

    def values(k: int) -> torch.Tensor:  # rank k's tensor, made on the CPU, moved where tensors go
        g = torch.Generator(device="cpu").manual_seed(100 + k)
        made = torch.randn(count, dtype=torch.float64, generator=g, device="cpu")
        return made.to(torch.empty(0).device)

    x = values(r)
    mine = [values(k) for k in range(n)]
    got = hvd.allreduce(x, op=hvd.Sum, name="large")
    assert torch.allclose(got, sum(mine), rtol=0, atol=1e-12)
    rows = hvd.allgather(got[-5000:].unsqueeze(0), name="large.rows")
    assert all(torch.equal(rows[0], row) for row in rows), "ranks got different sums"
    xi = torch.arange(count, dtype=torch.int64) * (r + 1)
    close(hvd.allreduce(xi, op=hvd.Max, name="large.max"), torch.arange(count) * n)
    close(hvd.allreduce(xi, op=hvd.Min, name="large.min"), torch.arange(count))


# Every dtype as allreduce reduces it: widened (half precision in float32), then cast back.
WIDE = {
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
    torch.int16: torch.int32,
    torch.bool: torch.int32,
}
REDUCE = {
    hvd.Sum: torch.add,
    hvd.Average: torch.add,
    hvd.Min: torch.minimum,
    hvd.Max: torch.maximum,
    hvd.Product: torch.mul,
}


def scaled(t: torch.Tensor, factor: float) -> torch.Tensor:
    """Floats multiplied as they are; integers scaled in float64 and truncated back."""
    if factor == 1.0:
        return t
    return t * factor if t.is_floating_point() else (t.double() * factor).to(t.dtype)


def reduced(
    xs: list[torch.Tensor], op: int, prescale: float = 1.0, postscale: float = 1.0
) -> torch.Tensor:
    """What an allreduce of every rank's input (`xs`, in rank order) must give."""
    dt = xs[0].dtype
    acc = scaled(xs[0].to(WIDE.get(dt, dt)), prescale)
    for x in xs[1:]:
        acc = REDUCE[op](acc, scaled(x.to(acc.dtype), prescale))
    acc = scaled(acc, postscale / len(xs) if op == hvd.Average else postscale)
    return acc != 0 if dt == torch.bool else acc.to(dt)


def inputs(count: int, dt: torch.dtype, n: int, seed: int) -> list[torch.Tensor]:
    """Every rank's input, the same on every rank (made on the CPU: one generator everywhere)."""
    out = []
    for k in range(n):
        g = torch.Generator(device="cpu").manual_seed(seed + k)
        if dt.is_floating_point:
            x = torch.randn(count, generator=g, device="cpu") * 4
        else:
            low = 0 if dt in (torch.uint8, torch.bool) else -3
            high = 2 if dt == torch.bool else 4
            x = torch.randint(low, high, (count,), generator=g, device="cpu")
        out.append(x.to(dt))
    return out


def boundary_counts(n: int, itemsize: int) -> list[int]:
    """Element counts around the shared-memory path's seams: the largest buffer reduced whole
    and the next, and one below and one above a whole number of pipeline steps (the last share
    then ends a piece short of one element, or has one more piece, of one element)."""
    whole = _shm.whole_bytes(n) // itemsize
    step = n * _shm.piece_elements(itemsize, n)
    steps = whole // step + 1
    return [whole, whole + 1, steps * step - 1, steps * step + 1]


MIN_MAX = (hvd.Min, hvd.Max)


def in_rank_order(op: int) -> bool:
    """Whether an allreduce's result is bitwise the rank-order reduction: on the CPU of one host
    (shared memory), or for Min and Max anywhere. Across hosts, gloo and the hierarchical path
    each reduce in an order of their own, as NCCL does on GPUs."""
    return torch.empty(0).device.type == "cpu" and (hvd.cross_size() == 1 or op in MIN_MAX)


def same_result(got: torch.Tensor, want: torch.Tensor, exact: bool, what: object) -> None:
    """Bitwise where `exact` (and for integers), else within a few roundings of the dtype
    (an order of its own: NCCL's, gloo's across hosts, the hierarchical path's)."""
    assert got.dtype == want.dtype, (what, got.dtype)
    if exact or not want.is_floating_point():
        assert torch.equal(got, want), what
    else:
        tol = 16 * torch.finfo(want.dtype).eps
        scale = float(want.abs().max()) if want.numel() else 0.0
        assert torch.allclose(got.double(), want.double(), rtol=tol, atol=tol * scale), what


@case
def allreduce_chunk_boundaries(r: int, n: int) -> None:
    """Sizes across the shared-memory path's seams, every dtype and op, in place and out of
    place, prescaled and postscaled: exactly the rank-order reduction on one host's CPU."""
    where = torch.empty(0).device
    ops = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]
    for dt in DTYPES:
        # the seams of the buffer shared memory sees: widened dtypes are reduced widened
        whole, above, below_step, above_step = boundary_counts(n, WIDE.get(dt, dt).itemsize)
        longest = inputs(above_step, dt, n, seed=1000)
        plan = [(whole, [hvd.Sum]), (above, ops), (below_step, [hvd.Max]), (above_step, ops)]
        for count, count_ops in plan:
            xs = [x[:count] for x in longest]
            for i, op in enumerate(count_ops):
                name = f"seam.{dt}.{count}.{op}"
                x = xs[r].to(where, copy=True)
                if (i + count) % 2:
                    got = hvd.allreduce(x, op=op, name=name)
                    assert torch.equal(x.cpu(), xs[r]), f"{name} changed its input"
                else:
                    got = hvd.allreduce_(x, op=op, name=name)
                same_result(got.cpu(), reduced(xs, op), in_rank_order(op), name)
    count = boundary_counts(n, 4)[-1]
    exact = in_rank_order(hvd.Sum)
    for dt in (torch.float32, torch.float16, torch.int32):
        xs = inputs(count, dt, n, seed=7)
        for op in (hvd.Sum, hvd.Average):
            for inplace in (False, True):
                x = xs[r].to(where, copy=True)
                call = hvd.allreduce_ if inplace else hvd.allreduce
                got = call(x, op=op, prescale_factor=0.5, postscale_factor=3.0)
                want = reduced(xs, op, prescale=0.5, postscale=3.0)
                same_result(got.cpu(), want, exact, (dt, op, inplace))
    # A fused bucket larger than a slot: through the fusion buffer and the pipeline.
    parts = [inputs(count, torch.float32, n, seed=20 + j) for j in range(3)]
    got = hvd.grouped_allreduce_([p[r].to(where, copy=True) for p in parts], op=hvd.Average)
    for p, g in zip(parts, got, strict=True):
        same_result(g.cpu(), reduced(p, hvd.Average), exact, "grouped")


@case
def shared_memory_between_hook(r: int, n: int) -> None:
    """The reducer's hook for a hierarchical allreduce sees each piece of this rank's share
    once, reduced within the host, before it is scaled and gathered (on several hosts, each
    host's reducer on its own ranks)."""
    info = _state.get().groups[0]
    local = info.local or (info.hierarchy.local if info.hierarchy is not None else None)
    if local is None:  # HORA_SHM=0: no shared memory to test
        return
    first = r - hvd.local_rank()  # ranks are numbered host by host
    size, me = hvd.local_size(), hvd.local_rank()
    count = 2 * size * _shm.piece_elements(4, size, across=True) + 1  # pieces of a few steps
    xs = inputs(count, torch.float32, n, seed=99)[first : first + size]
    seen: list[int] = []

    def between(piece: torch.Tensor) -> None:
        seen.append(piece.numel())
        piece.mul_(3.0)

    hvd.barrier()  # nothing in flight: this thread may use the reducer
    out = torch.empty(count, device="cpu")  # the reducer's own CPU path, whatever the job's device
    local.allreduce(xs[me], out, hvd.Sum, scale=0.5, between=between)
    assert torch.equal(out, reduced(xs, hvd.Sum) * 3.0 * 0.5)
    lo, hi = _shm.shares(count, 4, size)[me]
    assert sum(seen) == hi - lo and len(seen) > (1 if size > 1 else 0), seen


def hierarchical_runs(r: int, n: int, size: int) -> list[tuple[str, int, torch.Tensor]]:
    """(what, op, this rank's input) for every allreduce, in the order every rank runs them:
    some shares empty; one piece per share; several steps (widened and not, 4 and 8 bytes)."""
    piece = _shm.piece_elements(4, size, across=True)
    small, steps = [3, 1000], 2 * size * piece + 17
    ops = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]
    runs = []
    for dt in DTYPES:
        xs = inputs(steps, dt, n, seed=500)
        for count in small:
            for op in ops:
                if dt != torch.bool or op not in (hvd.Average, hvd.Product):
                    runs.append((f"{dt}.{count}.{op}", op, xs[r][:count]))
        if dt in (torch.float32, torch.int64, torch.float16):
            runs += [(f"{dt}.{steps}.{op}", op, xs[r]) for op in (hvd.Sum, hvd.Average, hvd.Max)]
    return runs


def hierarchical_allreduces(runs: list[tuple[str, int, torch.Tensor]]) -> list[torch.Tensor]:
    out = []
    for i, (what, op, x) in enumerate(runs):
        if i % 2:
            out.append(hvd.allreduce(x, op=op, name=f"hier.{what}"))
        else:
            out.append(hvd.allreduce_(x.clone(), op=op, name=f"hier.{what}"))
    return out


def hierarchical_moves(r: int, n: int, size: int) -> list[torch.Tensor]:
    """Allgathers (uneven rows, a segment over a slot long) and broadcasts (every root, one
    tensor of two steps and fused small ones)."""
    cpu = torch.device("cpu")
    rows = 1 + (_shm.SLOT_BYTES // 24 if r % 2 else r)
    mine = torch.arange(rows * 3, dtype=torch.float64, device=cpu).reshape(rows, 3) + r
    out = [hvd.allgather(mine, name="hier.ag")]
    out += hvd.grouped_allgather([mine[:2].to(torch.int8), mine[: r + 1]], name="hier.gag")
    big = torch.full((size * _shm.SLOT_BYTES // 4 + 5,), float(r), device=cpu)
    for root in range(n):
        out.append(hvd.broadcast(big, root, name=f"hier.bc.{root}"))
        small = [torch.full((k + 1,), r * 10 + k, dtype=torch.int32) for k in range(3)]
        handles = [
            hvd.broadcast_async(t, root, name=f"hier.bc.{root}.{k}") for k, t in enumerate(small)
        ]
        out += [hvd.synchronize(h) for h in handles]
    return out


@case
def hierarchical_matches_flat(r: int, n: int) -> None:
    """On several hosts, the hierarchical path gives what the flat one (gloo over every rank)
    gives: for every dtype and op and across its seams (small, pipelined, several steps), in
    place and out; allgather (uneven rows, several steps of a slot) and broadcast (every root,
    one tensor and fused) bitwise; allreduce bitwise for integers, bool, Min and Max, within a
    few roundings for floating-point sums and products (the order differs), and bitwise the same
    on every rank."""
    info = _state.get().groups[0]
    hierarchy = info.hierarchy
    if hvd.cross_size() == 1 or n == hvd.cross_size():
        assert hierarchy is None  # one host (shared memory), or one rank per host (flat)
        return
    if hierarchy is None:
        assert off("HORA_SHM") or (
            off("HOROVOD_HIERARCHICAL_ALLREDUCE") and off("HOROVOD_HIERARCHICAL_ALLGATHER")
        )
        return
    size = max(len(ranks) for ranks in hierarchy.hosts)  # the same on every rank
    runs = hierarchical_runs(r, n, size)
    before = dict(_backends.stats)
    hier_reduced, hier_moved = hierarchical_allreduces(runs), hierarchical_moves(r, n, size)
    counted = {k: _backends.stats[k] - before.get(k, 0) for k in _backends.stats}
    hvd.barrier()  # nothing of this rank in flight: its engine reads `hierarchy` per bucket
    info.hierarchy = None
    try:
        flat_reduced, flat_moved = hierarchical_allreduces(runs), hierarchical_moves(r, n, size)
    finally:
        hvd.barrier()
        info.hierarchy = hierarchy
    assert counted.get("hierarchical_allreduce_calls", 0) == (
        len(runs) if hierarchy.allreduce_on else 0
    ), counted
    assert counted.get("hierarchical_allgather_calls", 0) == (2 if hierarchy.allgather_on else 0)
    assert (counted.get("hierarchical_broadcast_calls", 0) >= 2 * n) == hierarchy.allgather_on
    for (what, op, _), got, want in zip(runs, hier_reduced, flat_reduced, strict=True):
        same_result(got, want, op in MIN_MAX, what)
    for got, want in zip(hier_moved, flat_moved, strict=True):
        assert torch.equal(got, want), (got, want)
    digests = [hashlib.sha1(as_bytes(t).numpy()).hexdigest() for t in hier_reduced]
    everyone = hvd.allgather_object(digests)
    assert all(d == digests for d in everyone), "ranks got different bits"


@case
def allreduce_average_flag(r: int, n: int) -> None:
    x = torch.ones(2) * (r + 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = hvd.allreduce(x, average=False)
    assert any("average" in str(w.message) for w in caught), "no deprecation warning"
    close(got, torch.full((2,), n * (n + 1) / 2))
    expect_raises(ValueError, lambda: hvd.allreduce(x, average=True, op=hvd.Sum))
    expect_raises(NotImplementedError, lambda: hvd.allreduce(x, op=hvd.Adasum), "Adasum")


@case
def allreduce_inplace_and_async(r: int, n: int) -> None:
    x = torch.full((5,), float(r))
    same = hvd.allreduce_(x, op=hvd.Sum)
    assert same is x
    close(x, torch.full((5,), float(sum(range(n)))))
    y = torch.full((3,), float(r))
    h = hvd.allreduce_async(y, name="async.out", op=hvd.Max)
    out = hvd.synchronize(h)
    close(out, torch.full((3,), float(n - 1)))
    assert torch.equal(y, torch.full((3,), float(r)))
    z = torch.full((3,), 1.0)
    h = hvd.allreduce_async_(z, name="async.in", op=hvd.Sum)
    assert hvd.synchronize(h) is z
    close(z, torch.full((3,), float(n)))
    expect_raises(ValueError, lambda: hvd.synchronize(h))  # a handle is cleared once used


@case
def grouped_allreduce(r: int, n: int) -> None:
    ts = [torch.full((k + 1,), float(r + k)) for k in range(4)] + [
        torch.full((2,), r, dtype=torch.int64)
    ]
    outs = hvd.grouped_allreduce(ts, op=hvd.Sum)
    for k in range(4):
        close(outs[k], torch.full((k + 1,), float(sum(range(n)) + n * k)))
    close(outs[4], torch.full((2,), sum(range(n)), dtype=torch.int64))
    same = hvd.grouped_allreduce_(ts[:2], op=hvd.Sum)
    assert same[0] is ts[0] and same[1] is ts[1]
    h = hvd.grouped_allreduce_async([torch.ones(2), torch.ones(3)], op=hvd.Sum)
    a, b = hvd.synchronize(h)
    close(a, torch.full((2,), float(n)))
    close(b, torch.full((3,), float(n)))
    h = hvd.grouped_allreduce_async_([torch.ones(2)], op=hvd.Sum)
    close(hvd.synchronize(h)[0], torch.full((2,), float(n)))


@case
def errors_local(r: int, n: int) -> None:
    nc = torch.ones(4, 4).t()
    expect_raises(ValueError, lambda: hvd.allreduce(nc), "contiguous")
    # A name still in flight cannot be reused: rank k's "dup.k" stays pending until the others
    # submit it, which they only do after a barrier that rank k enters after its check.
    for k in range(n):
        if r == k:
            h = hvd.allreduce_async(torch.ones(1), name=f"dup.{k}")
            expect_raises(
                ValueError, lambda k=k: hvd.allreduce_async(torch.ones(1), name=f"dup.{k}")
            )
            hvd.barrier()
        else:
            hvd.barrier()
            h = hvd.allreduce_async(torch.ones(1), name=f"dup.{k}")
        hvd.synchronize(h)
    expect_raises(
        ValueError, lambda: hvd.grouped_allreduce([torch.ones(1), torch.ones(1, device="meta")])
    )
    expect_raises(ValueError, lambda: hvd.reducescatter(torch.tensor(1.0)))
    expect_raises(ValueError, lambda: hvd.reducescatter(torch.ones(4), op=hvd.Max))
    expect_raises(ValueError, lambda: hvd.allgather(torch.tensor(1.0)))
    expect_raises(
        ValueError, lambda: hvd.alltoall(torch.ones(n + 1) if n > 1 else torch.tensor(1.0))
    )
    expect_raises(
        ValueError, lambda: hvd.alltoall(torch.ones(4), splits=torch.ones(n, dtype=torch.int64))
    )
    expect_raises(
        ValueError,
        lambda: hvd.alltoall(torch.ones(4), splits=torch.full((n,), -1, dtype=torch.int32)),
    )
    expect_raises(
        ValueError,
        lambda: hvd.alltoall(torch.ones(2), splits=torch.full((n,), 2, dtype=torch.int32)),
    )
    expect_raises(ValueError, lambda: hvd.broadcast(torch.ones(1), root_rank=n))
    expect_raises(ValueError, lambda: hvd.synchronize(123456789))


# ----- dtypes ------------------------------------------------------------------------------------
DTYPES = [
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.bool,
]


@case
def dtypes(r: int, n: int) -> None:
    for dt in DTYPES:
        ones = torch.ones(3, dtype=dt)
        got = hvd.allreduce(ones, op=hvd.Sum, name=f"dt.sum.{dt}")
        want = torch.ones(3, dtype=dt) if dt == torch.bool else torch.full((3,), n, dtype=dt)
        assert got.dtype == dt and torch.equal(got, want), (dt, got)
        if dt != torch.bool:
            got = hvd.allreduce(torch.full((2,), r + 1, dtype=dt), op=hvd.Max)
            assert torch.equal(got, torch.full((2,), n, dtype=dt)), (dt, got)
        mine = torch.full((r + 1, 2), r % 2, dtype=dt)
        gathered = hvd.allgather(mine, name=f"dt.ag.{dt}")
        want = torch.cat([torch.full((k + 1, 2), k % 2, dtype=dt) for k in range(n)])
        assert torch.equal(gathered, want), (dt, gathered)
        src = torch.full((4,), (r + 1) % 2, dtype=dt)
        assert torch.equal(hvd.broadcast(src, 0), torch.full((4,), 1, dtype=dt)), dt
        a2a = hvd.alltoall(torch.full((n, 2), r % 2, dtype=dt))
        want = torch.tensor([[k % 2] * 2 for k in range(n)], dtype=dt)
        assert torch.equal(a2a, want), (dt, a2a)
    # int16 overflow wraps as int16 arithmetic would.
    big = torch.full((1,), 30000, dtype=torch.int16)
    got = hvd.allreduce(big, op=hvd.Sum)
    assert torch.equal(got, (torch.full((1,), 30000, dtype=torch.int32) * n).to(torch.int16))
    # Half precision is reduced in float32: 2048 + 1 + ... stays exact where fp16 sums would not.
    h = torch.tensor([2048.0 if r == 0 else 1.0], dtype=torch.float16)
    got = hvd.allreduce(h, op=hvd.Sum)
    assert got.item() == float(torch.tensor(2048.0 + (n - 1), dtype=torch.float16)), got


# ----- allgather / broadcast / alltoall / reducescatter -----------------------------------------
@case
def allgather_uneven(r: int, n: int) -> None:
    mine = torch.arange((r + 1) * 3, dtype=torch.float32).reshape(r + 1, 3) + 100 * r
    got = hvd.allgather(mine)
    want = torch.cat([torch.arange((k + 1) * 3.0).reshape(k + 1, 3) + 100 * k for k in range(n)])
    close(got, want)
    empty = hvd.allgather(torch.ones((0 if r == 0 else 1), 2))
    assert empty.shape == (n - 1, 2)
    h = hvd.allgather_async(torch.full((1,), r))
    assert torch.equal(hvd.synchronize(h), torch.arange(n))


@case
def grouped_allgather(r: int, n: int) -> None:
    a = torch.full((r + 1,), r, dtype=torch.int64)
    b = torch.full((1, 2), float(r), dtype=torch.float64)
    ga, gb = hvd.grouped_allgather([a, b])
    assert torch.equal(ga, torch.cat([torch.full((k + 1,), k) for k in range(n)]))
    close(gb, torch.cat([torch.full((1, 2), float(k), dtype=torch.float64) for k in range(n)]))
    h = hvd.grouped_allgather_async([a])
    assert torch.equal(hvd.synchronize(h)[0], ga)


@case
def broadcast_forms(r: int, n: int) -> None:
    root = n - 1
    src = torch.full((3, 2), float(r))
    out = hvd.broadcast(src, root)
    close(out, torch.full((3, 2), float(root)))
    assert torch.equal(src, torch.full((3, 2), float(r))), "broadcast changed its source"
    same = hvd.broadcast_(src, root)
    assert same is src
    close(src, torch.full((3, 2), float(root)))
    t = torch.full((2,), float(r))
    h = hvd.broadcast_async_(t, 0)
    assert hvd.synchronize(h) is t and torch.equal(t, torch.zeros(2))
    h = hvd.broadcast_async(torch.full((2,), float(r)), 0, name="bcast.async")
    close(hvd.synchronize(h), torch.zeros(2))


@case
def alltoall_forms(r: int, n: int) -> None:
    x = torch.arange(2 * n, dtype=torch.float32) + 100 * r
    got = hvd.alltoall(x)
    want = torch.cat(
        [torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) + 100 * k for k in range(n)]
    )
    close(got, want)
    # rank r sends k+1 rows to rank k (row values tell the sender), plus one unsent row.
    splits = torch.tensor([k + 1 for k in range(n)], dtype=torch.int32)
    rows = int(splits.sum()) + 1
    x = torch.full((rows, 2), float(r))
    out, received = hvd.alltoall(x, splits=splits)
    assert received.dtype == torch.int32 and received.tolist() == [r + 1] * n
    close(out, torch.cat([torch.full((r + 1, 2), float(k)) for k in range(n)]))
    h = hvd.alltoall_async(x, splits=splits)
    out2, received2 = hvd.synchronize(h)
    close(out2, out)
    assert received2.tolist() == received.tolist()


@case
def reducescatter_forms(r: int, n: int) -> None:
    x = torch.arange(2 * n * 3, dtype=torch.float32).reshape(2 * n, 3) * (r + 1)
    factor = n * (n + 1) / 2
    got = hvd.reducescatter(x, op=hvd.Sum)
    close(got, torch.arange(2 * n * 3.0).reshape(2 * n, 3)[2 * r : 2 * r + 2] * factor)
    got = hvd.reducescatter(x)
    close(got, torch.arange(2 * n * 3.0).reshape(2 * n, 3)[2 * r : 2 * r + 2] * factor / n)
    # Uneven: ranks < dim0 % size get one extra row.
    rows = 2 * n + 1
    y = torch.arange(rows, dtype=torch.float32) + r
    counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    start = sum(counts[:r])
    got = hvd.reducescatter(y, op=hvd.Sum)
    close(
        got,
        (torch.arange(rows, dtype=torch.float32) * n + sum(range(n)))[start : start + counts[r]],
    )
    ga, gb = hvd.grouped_reducescatter([x, torch.ones(n, dtype=torch.int32)], op=hvd.Sum)
    close(ga, torch.arange(2 * n * 3.0).reshape(2 * n, 3)[2 * r : 2 * r + 2] * factor)
    assert torch.equal(gb, torch.full((1,), n, dtype=torch.int32))
    h = hvd.reducescatter_async(torch.ones(n, 2), op=hvd.Sum)
    close(hvd.synchronize(h), torch.full((1, 2), float(n)))


@case
def zero_sized_tensors(r: int, n: int) -> None:
    """Every op takes tensors with no elements, in every dtype, and the engine keeps working
    after them (an empty alltoall of int16 once broke the engine for every op after it)."""
    for dt in DTYPES:
        empty = torch.empty((n, 0), dtype=dt)
        got = hvd.alltoall(empty, name=f"zero.a2a.{dt}")
        assert got.dtype == dt and got.shape == (n, 0), (dt, got.shape)
        out, received = hvd.alltoall(empty, splits=torch.ones(n, dtype=torch.int32))
        assert out.shape == (n, 0) and received.tolist() == [1] * n, (dt, out.shape)
        assert hvd.allreduce(torch.empty(0, dtype=dt), op=hvd.Sum).shape == (0,), dt
        assert hvd.allgather(torch.empty((r, 0), dtype=dt)).shape == (sum(range(n)), 0), dt
        assert hvd.allgather(torch.empty((0, 3), dtype=dt)).shape == (0, 3), dt
        assert hvd.broadcast(torch.empty((2, 0), dtype=dt), 0).shape == (2, 0), dt
        if dt != torch.bool:
            got = hvd.reducescatter(torch.empty((0, 2), dtype=dt), op=hvd.Sum)
            assert got.shape == (0, 2), (dt, got.shape)
        ones = torch.ones(2, dtype=dt)
        assert torch.equal(hvd.allreduce(ones, op=hvd.Max), ones), dt  # the engine still works
    ga, gb = hvd.grouped_allreduce([torch.empty(0), torch.ones(2)], op=hvd.Sum)
    assert ga.shape == (0,) and torch.equal(gb, torch.full((2,), float(n)))


# ----- negotiation ------------------------------------------------------------------------------
@case
def submission_order(r: int, n: int) -> None:
    names = [f"order.{k}" for k in range(6)]
    order = names if r % 2 == 0 else names[::-1]
    handles = {
        nm: hvd.allreduce_async(torch.full((k + 1,), float(r + k)), name=nm, op=hvd.Sum)
        for k, nm in sorted(enumerate(names), key=lambda kv: order.index(kv[1]))
    }
    for k, nm in enumerate(names):
        close(hvd.synchronize(handles[nm]), torch.full((k + 1,), float(sum(range(n)) + n * k)))
    # Mixed kinds, opposite orders.
    if r % 2 == 0:
        hg = hvd.allgather_async(torch.full((1,), r), name="mix.g")
        hb = hvd.broadcast_async(torch.full((1,), float(r)), 0, name="mix.b")
    else:
        hb = hvd.broadcast_async(torch.full((1,), float(r)), 0, name="mix.b")
        hg = hvd.allgather_async(torch.full((1,), r), name="mix.g")
    assert torch.equal(hvd.synchronize(hg), torch.arange(n))
    close(hvd.synchronize(hb), torch.zeros(1))


@case
def poll_is_async(r: int, n: int) -> None:
    # Rank 0 submits "late" and polls before the others can have submitted it: they only do so
    # after a barrier that rank 0 enters after polling.
    if r == 0:
        h = hvd.allreduce_async(torch.ones(2), name="late", op=hvd.Sum)
        polls = [hvd.poll(h) for _ in range(3)]
        time.sleep(0.05)
        polls.append(hvd.poll(h))
        hvd.barrier()
        assert polls == [False] * 4, polls
    else:
        hvd.barrier()
        h = hvd.allreduce_async(torch.ones(2), name="late", op=hvd.Sum)
    out = hvd.synchronize(h)
    close(out, torch.full((2,), float(n)))


def _poll_until_done(handles: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(hvd.poll(h) for h in handles) and time.monotonic() < deadline:
        time.sleep(0.001)


@case
def threads_wait_together(r: int, n: int) -> None:
    # A caller blocked in synchronize drives the engine; several threads wait at once here, one
    # polls, and thread "b" waits for an op that rank 0 submits only after its thread "a" was
    # served: a driver never holds up another thread's completed operation.
    import threading

    results: dict[str, object] = {}
    a_done = threading.Event()

    def worker(tag: str, count: int) -> None:
        try:
            if tag == "b" and r == 0:
                a_done.wait(30)
            hs = [
                hvd.allreduce_async(torch.full((k + 1,), float(r)), name=f"{tag}{k}", op=hvd.Sum)
                for k in range(count)
            ]
            if tag == "p":
                _poll_until_done(hs, timeout=30)
            results[tag] = [hvd.synchronize(h) for h in hs]
            if tag == "a":
                a_done.set()
        except Exception as exc:  # reported below, on the main thread
            results[tag] = exc

    threads = [threading.Thread(target=worker, args=(t, 5)) for t in ("a", "b", "c", "p")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    want = float(sum(range(n)))
    for tag in ("a", "b", "c", "p"):
        outs = results.get(tag)
        assert isinstance(outs, list), (tag, outs)
        for k, out in enumerate(outs):
            # made in a thread: torch's default device is per thread (the GPU suite sets it)
            close(out, torch.full((k + 1,), want, device=out.device))


@case
def fusion(r: int, n: int) -> None:
    before = _backends.stats["allreduce_calls"]
    outs = hvd.grouped_allreduce([torch.full((64,), float(r)) for _ in range(10)], op=hvd.Sum)
    assert _backends.stats["allreduce_calls"] - before == 1, "grouped allreduce was not fused"
    for o in outs:
        close(o, torch.full((64,), float(sum(range(n)))))
    hvd.barrier()
    before = _backends.stats["allreduce_calls"]
    fused_before = _backends.stats["fused_entries"]
    handles = [
        hvd.allreduce_async(torch.full((1024,), float(r + k)), op=hvd.Sum) for k in range(64)
    ]
    for k, h in enumerate(handles):
        close(hvd.synchronize(h), torch.full((1024,), float(sum(range(n)) + n * k)))
    calls = _backends.stats["allreduce_calls"] - before
    assert calls <= 32, f"64 small allreduces took {calls} backend calls"
    assert _backends.stats["fused_entries"] - fused_before >= 32


@case
def fusion_buffer_in_place(r: int, n: int) -> None:
    """In-place fused allreduces go through one persistent buffer and views made once per
    layout: repeated and changing layouts, mixed dtypes and shapes stay exact, and an earlier
    out-of-place result (a view of a fresh buffer) is not touched by later batches."""
    from hora.collectives._control import state as _state

    total = float(sum(range(n)))
    kept = hvd.grouped_allreduce([torch.full((8,), float(r)) for _ in range(3)], op=hvd.Sum)
    fusion = _state.get().groups[0].fusion
    for layout, shapes in enumerate([[(3, 4), (5,), (1, 1, 2)] * 10, [(7,), (2, 2)] * 20]):
        for step in range(3):
            ts = [
                torch.full(s, float(r + k + step), dtype=torch.float64 if k % 3 else torch.float32)
                for k, s in enumerate(shapes)
            ]
            names = [f"fb.{layout}.{k}" for k in range(len(ts))]
            handles = [
                hvd.allreduce_async_(t, name=nm, op=hvd.Sum)
                for t, nm in zip(ts, names, strict=True)
            ]
            for k, (t, h) in enumerate(zip(ts, handles, strict=True)):
                assert hvd.synchronize(h) is t
                close(t, torch.full(t.shape, total + n * (k + step), dtype=t.dtype))
        group = [torch.full((4, 2), float(r + k)) for k in range(5)]
        hvd.grouped_allreduce_(group, op=hvd.Sum)
        for k, t in enumerate(group):
            close(t, torch.full((4, 2), total + n * k))
    for o in kept:
        close(o, torch.full((8,), total))
    # reused, not one per step; CUDA tensors that share a GPU go through the host-staged path,
    # not this CPU buffer
    layouts = len(fusion._layouts)
    assert layouts <= 8 and (layouts > 0 or kept[0].is_cuda), layouts


@case
def a_name_reused_with_other_tensors(r: int, n: int) -> None:
    """One name submitted step after step: the same request object travels each time (made
    once), and the same name with another shape, dtype or op is a request of its own, exact."""
    from hora.collectives._control import requests as _requests

    total = float(sum(range(n)))
    for step in range(6):
        shape = (3,) if step % 2 else (5, 2)
        dtype = torch.float64 if step % 3 == 0 else torch.float32
        op = hvd.Max if step == 4 else hvd.Sum
        t = torch.full(shape, float(r + step), dtype=dtype)
        hvd.allreduce_(t, name="reused", op=op)
        want = float(n - 1 + step) if op == hvd.Max else total + n * step
        close(t, torch.full(shape, want, dtype=dtype))
    for _ in range(3):
        hvd.allreduce_(torch.ones(7), name="reused.same", op=hvd.Sum)
    made = [req for key, req in _requests._REQUESTS.items() if key[0] == "allreduce.reused.same"]
    assert len(made) == 1, made  # built once, then found
    made = [key for key in _requests._REQUESTS if key[0] == "allreduce.reused"]
    assert len(made) == 5, made  # one per shape, dtype and op seen


@case
def mismatches(r: int, n: int) -> None:
    odd = r == n - 1
    msgs = [
        expect_raises(
            hvd.HorovodInternalError,
            lambda: hvd.allreduce(torch.ones(2 + odd), name="mm.shape"),
            "shape",
        ),
        expect_raises(
            hvd.HorovodInternalError,
            lambda: hvd.allreduce(
                torch.ones(2, dtype=torch.float64 if odd else torch.float32), name="mm.dtype"
            ),
            "type",
        ),
        expect_raises(
            hvd.HorovodInternalError,
            lambda: hvd.allreduce(torch.ones(2), op=hvd.Max if odd else hvd.Sum, name="mm.op"),
            "op",
        ),
        expect_raises(
            hvd.HorovodInternalError,
            lambda: hvd.allreduce(
                torch.ones(2), prescale_factor=2.0 if odd else 1.0, name="mm.scale"
            ),
            "scale",
        ),
        expect_raises(
            hvd.HorovodInternalError,
            lambda: hvd.broadcast(torch.ones(2), 1 if odd else 0, name="mm.root"),
            "root",
        ),
        expect_raises(
            hvd.HorovodInternalError,
            lambda: hvd.allgather(torch.ones(1, 2 + odd), name="mm.ag"),
            "shape",
        ),
        expect_raises(
            hvd.HorovodInternalError,
            lambda: hvd.grouped_allreduce([torch.ones(1)] * (2 + odd), name="mm.group"),
            "number of tensors",
        ),
    ]
    assert all(f"rank {n - 1}" in m for m in msgs), msgs
    close(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)))  # still healthy


@case
def barrier_and_join(r: int, n: int) -> None:
    hvd.barrier()
    # Rank 0 joins at once; the others reduce, rank 0 contributing zeros. As in Horovod, an
    # Average still divides by the whole world, and allgather, broadcast and alltoall are
    # refused (on the ranks that submitted them) while a rank has joined.
    if r == 0:
        last = hvd.join()
    else:
        a = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="join.a")
        close(a, torch.full((3,), float(n - 1)))
        avg = hvd.allreduce(torch.full((2,), float(n)), name="join.avg")
        close(avg, torch.full((2,), float(n - 1)))
        refused = {
            "Allgather": lambda: hvd.allgather(torch.full((1,), r), name="join.g"),
            "Broadcast": lambda: hvd.broadcast(torch.ones(1), root_rank=n - 1, name="join.b"),
            "Alltoall": lambda: hvd.alltoall(torch.ones(n), name="join.a2a"),
        }
        for kind, fn in refused.items():
            expect_raises(hvd.HorovodInternalError, fn, f"{kind} is not supported with Join")
        if r == n - 1:
            time.sleep(0.05)  # let the other ranks join first
        last = hvd.join()
    assert last == (n - 1 if n > 1 else 0), last
    # Once every rank has joined, nothing of the refused ops is left behind.
    assert torch.equal(hvd.allgather(torch.full((1,), r), name="join.g"), torch.arange(n))
    close(
        hvd.broadcast(torch.full((1,), float(r)), root_rank=n - 1, name="join.b"),
        torch.full((1,), float(n - 1)),
    )


@case
def process_sets(r: int, n: int) -> None:
    members = [0, n - 1] if n > 2 else [n - 1]  # a proper subset: a pair, or a single rank
    ps = hvd.add_process_set(members[::-1])
    assert ps.process_set_id is not None and ps.ranks == members
    expect_raises(ValueError, lambda: hvd.add_process_set(members), "exists")
    expect_raises(ValueError, lambda: hvd.add_process_set(list(range(n))), "exists")
    if r in ps.ranks:
        assert ps.included() and ps.rank() == ps.ranks.index(r) and ps.size() == len(ps.ranks)
        got = hvd.allreduce(torch.full((2,), float(r)), op=hvd.Sum, process_set=ps)
        close(got, torch.full((2,), float(sum(ps.ranks))))
        got = hvd.broadcast(torch.full((1,), float(r)), root_rank=n - 1, process_set=ps)
        close(got, torch.full((1,), float(n - 1)))
        got = hvd.allgather(torch.full((1,), r), process_set=ps)
        assert got.tolist() == ps.ranks
    else:
        assert ps.included() is False and ps.rank() == -1
        expect_raises(ValueError, lambda: hvd.allreduce(torch.ones(1), process_set=ps), "member")
    close(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), float(n)))
    assert hvd.remove_process_set(ps) is True
    assert ps.process_set_id is None and ps.size() is None
    assert hvd.remove_process_set(ps) is False
    assert hvd.remove_process_set(hvd.global_process_set) is False


@case
def autograd(r: int, n: int) -> None:
    x = torch.full((3,), float(r + 1), requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum).sum().backward()
    close(x.grad, torch.full((3,), float(n)))
    x = torch.full((3,), float(r + 1), requires_grad=True)
    (hvd.allreduce(x) * 2).sum().backward()
    close(x.grad, torch.full((3,), 2.0))
    x = torch.full((3,), 1.0, requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0).sum().backward()
    close(x.grad, torch.full((3,), 2.0 * n))  # allreduce of the gradient, same scale
    # grouped allreduce
    a = torch.ones(2, requires_grad=True)
    b = torch.ones(3, requires_grad=True)
    oa, ob = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    (oa.sum() + 2 * ob.sum()).backward()
    close(a.grad, torch.full((2,), float(n)))
    close(b.grad, torch.full((3,), 2.0 * n))
    # allgather: the gradient of my rows of sum(w * y), w equal on every rank
    x = torch.ones(r + 1, 2, requires_grad=True)
    y = hvd.allgather(x)
    w = torch.arange(y.numel(), dtype=torch.float32).reshape(y.shape)
    (y * w).sum().backward()
    start = sum(k + 1 for k in range(r))
    close(x.grad, w[start : start + r + 1])
    # broadcast: the root gets the (averaged) gradient, the others zero
    x = torch.ones(2, requires_grad=True)
    hvd.broadcast(x, 0).sum().backward()
    close(x.grad, torch.ones(2) if r == 0 else torch.zeros(2))
    # alltoall: gradient flows back to the rows that were sent
    x = torch.ones(n + 1, requires_grad=True)
    splits = torch.ones(n, dtype=torch.int32)
    out, _ = hvd.alltoall(x, splits=splits)
    (out * (r + 1)).sum().backward()
    close(x.grad, torch.cat([torch.arange(1.0, n + 1), torch.zeros(1)]))
    # reducescatter: an allgather of the gradient (times size for Sum)
    x = torch.ones(2 * n, requires_grad=True)
    hvd.reducescatter(x, op=hvd.Sum).sum().backward()
    close(x.grad, torch.full((2 * n,), float(n)))
    x = torch.ones(2 * n, requires_grad=True)
    hvd.reducescatter(x).sum().backward()
    close(x.grad, torch.ones(2 * n))


@case
def alltoall_even_split_gradient(r: int, n: int) -> None:
    """Even split of a dim 0 that differs per rank: the gradient goes back by the rows each rank
    really sent (not by this rank's own split), then the next alltoalls still meet."""
    for _ in range(2):
        x = torch.full((n * (r + 1), 2), float(r), requires_grad=True)
        out = hvd.alltoall(x)
        assert out.shape == (sum(k + 1 for k in range(n)), 2), out.shape
        (out * 3).sum().backward()
        close(x.grad, torch.full((n * (r + 1), 2), 3.0))
    splits = torch.full((n,), 1, dtype=torch.int32)
    out, _ = hvd.alltoall(torch.full((n, 1), float(r)), splits=splits)
    close(out, torch.arange(n, dtype=torch.float32).reshape(n, 1))


@case
def sparse_allreduce(r: int, n: int) -> None:
    g = torch.Generator(device="cpu").manual_seed(10 + r)
    dense = torch.rand(6, 3, generator=g, device="cpu").to(torch.empty(0).device)
    dense[dense < 0.6] = 0
    dense[0] = r + 1.0  # a row every rank sends: summed
    sparse = dense.to_sparse()
    want_sum = hvd.allreduce(dense, op=hvd.Sum, name="sparse.dense")
    h = hvd.sparse_allreduce_async(sparse, name="sparse.sum", op=hvd.Sum)
    got = hvd.synchronize(h)
    assert got.is_sparse and got.shape == dense.shape
    close(got.to_dense(), want_sum)
    h = hvd.sparse_allreduce_async(sparse, "sparse.avg", hvd.Average)  # Horovod's positionals
    while not hvd.poll(h):
        time.sleep(0.001)
    close(h().to_dense(), want_sum / n)  # the handle is callable, as Horovod's is
    # Nothing non-zero on this rank: still takes part.
    empty = torch.zeros(4, 2).to_sparse() if r == 0 else torch.ones(4, 2).to_sparse()
    got = hvd.synchronize(hvd.sparse_allreduce_async(empty, name="sparse.empty", op=hvd.Sum))
    close(got.to_dense(), torch.full((4, 2), float(n - 1)))
    expect_raises(ValueError, lambda: hvd.sparse_allreduce_async(dense, "x", hvd.Sum), "sparse")


@case
def no_torch_warnings_reach_users(r: int, n: int) -> None:
    """torch's deprecations of the calls hora makes (on its engine thread) stay hidden."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hvd.allgather(torch.ones(r + 1, 2), name="warn.ag")
        hvd.allgather(torch.ones(2, 2), name="warn.ag.even")
        hvd.reducescatter(torch.ones(n + 1, 2), name="warn.rs")
    texts = [f"{w.category.__name__}: {w.message}" for w in caught]
    assert not texts, texts
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hvd.synchronize(hvd.sparse_allreduce_async(torch.ones(3).to_sparse(), "warn.sp", hvd.Sum))
    texts = [f"{w.category.__name__}: {w.message}" for w in caught]
    assert not texts, texts


@case
def init_after_engine_failure(r: int, n: int) -> None:
    """A collective that fails on the data path (neither gloo nor shared memory takes the Max of
    complex numbers) stops the engine on every rank: it and the next ops raise, nothing hangs.
    The next init() on every rank starts a working world, with the failed run's process sets
    gone."""
    ps = hvd.add_process_set([0])
    z = torch.ones(2, dtype=torch.complex64)
    expect_raises(hvd.HorovodInternalError, lambda: hvd.allreduce(z, op=hvd.Max), "complex")
    expect_raises(hvd.HorovodInternalError, lambda: hvd.allreduce(torch.ones(1)), "shut down")
    hvd.init(process_sets="dynamic")
    close(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)))
    assert ps.process_set_id is None and ps.size() is None
    again = hvd.add_process_set([0])  # not "already exists"
    if r == 0:
        close(hvd.allreduce(torch.ones(1), process_set=again), torch.ones(1))
    assert hvd.remove_process_set(again)


@case
def shutdown_then_init_after_peer_shutdown(r: int, n: int) -> None:
    """A peer's shutdown() stops rank 0's engine while it waits: its op raises, and (as in
    Horovod) so does every op until rank 0 too calls shutdown(); then init() works again."""
    ps = hvd.add_process_set([0])
    if r == 0:

        def waits() -> None:
            hvd.synchronize(hvd.allreduce_async(torch.ones(1), name="never"))

        expect_raises(hvd.HorovodInternalError, waits, "shut down")
        hvd.init(process_sets="dynamic")  # a no-op: the peers' shutdown was their own choice
        expect_raises(hvd.HorovodInternalError, lambda: hvd.allreduce(torch.ones(1)), "shut down")
    else:
        time.sleep(0.2)
    hvd.shutdown()
    hvd.init(process_sets="dynamic")
    close(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)))
    assert ps.process_set_id is None
    assert hvd.remove_process_set(hvd.add_process_set([0]))


@case
def shutdown_and_reinit(r: int, n: int) -> None:
    hvd.shutdown()
    assert not hvd.is_initialized()
    for fn in (hvd.size, hvd.rank, hvd.local_size, hvd.local_rank, hvd.cross_size, hvd.cross_rank):
        expect_raises(ValueError, fn, "Horovod has not been initialized; use hvd.init().")
    hvd.init(process_sets="dynamic")
    close(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)))


def run_all(only: list[str] | None = None) -> dict[str, str]:
    """Run every case (or those named `only`) on this rank; never raise, so that every outcome
    comes back."""
    hvd.init(process_sets="dynamic")
    r, n = hvd.rank(), hvd.size()
    outcomes: dict[str, str] = {}
    for name, fn in CASES.items():
        if only is not None and name not in only:
            continue
        if os.environ.get("HORA_CASES_VERBOSE"):
            print("case", name, flush=True)
        try:
            fn(r, n)
            outcomes[name] = "ok"
        except Exception:
            outcomes[name] = traceback.format_exc(limit=6)
        hvd.init(process_sets="dynamic")  # a case that shut down must not break the next one
    hvd.shutdown()
    return outcomes


def pretend_hosts(local_sizes: list[int]) -> None:
    """Tell this rank it sits on one of several hosts, of `local_sizes` ranks each, numbered
    host by host (before `hvd.init()`, which reads the placement from the launcher's variables):
    each pretended host gets a shared-memory segment of its own, so the hierarchical path runs
    on one machine as it would across hosts."""
    rank = int(os.environ["RANK"])
    host = next(h for h in range(len(local_sizes)) if rank < sum(local_sizes[: h + 1]))
    os.environ.update(
        HOROVOD_LOCAL_RANK=str(rank - sum(local_sizes[:host])),
        HOROVOD_LOCAL_SIZE=str(local_sizes[host]),
        HOROVOD_CROSS_RANK=str(host),
        HOROVOD_CROSS_SIZE=str(len(local_sizes)),
    )


def run_all_on_hosts(local_sizes: list[int], only: list[str] | None = None) -> dict[str, str]:
    """`run_all` on ranks that pretend to sit on several hosts (`pretend_hosts`)."""
    pretend_hosts(local_sizes)
    return run_all(only)


# ----- failure jobs ------------------------------------------------------------------------------
def peer_shutdown() -> str:
    """Rank 0 waits for an operation the others never submit; they shut down instead."""
    hvd.init()
    if hvd.rank() == 0:
        h = hvd.allreduce_async(torch.ones(1), name="never")
        start = time.monotonic()
        try:
            hvd.synchronize(h)
            return "no error"
        except hvd.HorovodInternalError as e:
            return f"raised after {time.monotonic() - start:.1f}s: {e}"
    time.sleep(0.2)
    hvd.shutdown()
    return "shut down"


def peer_dies(path: str) -> str:
    """The last rank dies in the middle; the others must raise, and write what they saw."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    hvd.allreduce(torch.ones(1))
    if r == n - 1:
        time.sleep(0.2)
        os._exit(3)
    return _outlive_dead_peer(path, r)


def peer_dies_in_shared_memory(path: str) -> str:
    """The last rank dies inside the shared-memory barrier of an allreduce (after its own copy,
    before the others' bytes came): the others are waiting there, and must raise."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    reducer = _state.get().groups[0].local
    assert reducer is not None, "this job should use shared memory"
    if r == n - 1:
        reducer._barrier = lambda: os._exit(3)  # die at exactly that point
    return _outlive_dead_peer(path, r)


def _outlive_dead_peer(path: str, r: int) -> str:
    """A surviving rank: allreduce with the dead one, write what happened, wait to be stopped."""
    start = time.monotonic()
    try:
        hvd.allreduce(torch.ones(1), name="orphan")
        outcome = "no error"
    except hvd.HorovodInternalError as e:
        outcome = f"HorovodInternalError after {time.monotonic() - start:.1f}s: {e}"
    with open(f"{path}.{r}.tmp", "w") as f:
        f.write(outcome)
    os.replace(f"{path}.{r}.tmp", f"{path}.{r}")
    time.sleep(30)  # the launcher kills us once it has seen the death
    return outcome


def fusion_threshold() -> dict[str, int]:
    """Under HOROVOD_FUSION_THRESHOLD=4096, 4 KB tensors are never fused together."""
    hvd.init()
    before = _backends.stats["allreduce_calls"]
    handles = [hvd.allreduce_async(torch.ones(1024), op=hvd.Sum) for _ in range(16)]
    for h in handles:
        hvd.synchronize(h)
    calls = _backends.stats["allreduce_calls"] - before
    before_small = _backends.stats["allreduce_calls"]
    handles = [hvd.allreduce_async(torch.ones(256), op=hvd.Sum) for _ in range(16)]
    for h in handles:
        hvd.synchronize(h)
    small = _backends.stats["allreduce_calls"] - before_small
    hvd.shutdown()
    return {"calls": calls, "small_calls": small}


def world_of_one() -> dict[str, object]:
    """No launcher environment at all: init() is a world of one and every collective works."""
    hvd.init()
    x = torch.arange(4.0)
    out = {
        "size": hvd.size(),
        "rank": hvd.rank(),
        "allreduce": hvd.allreduce(x).tolist(),
        "allgather": hvd.allgather(x).tolist(),
        "broadcast": hvd.broadcast(x, 0).tolist(),
        "alltoall": hvd.alltoall(x).tolist(),
        "reducescatter": hvd.reducescatter(x, op=hvd.Sum).tolist(),
        "join": hvd.join(),
    }
    hvd.barrier()
    hvd.shutdown()
    return out


def user_initialised() -> tuple[list[float], float, bool]:
    """torch.distributed initialised by the user first: hvd reuses it and leaves it alone."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    hvd.init()
    out = hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist()
    t = torch.ones(1)
    dist.all_reduce(t)
    hvd.shutdown()
    alive = dist.is_initialized()
    dist.destroy_process_group()
    return out, t.item(), alive
