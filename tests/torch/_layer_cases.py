"""Worker code for the tests of hora.torch's layer above the collectives.

Each test module launches ONE job per world size that runs every case of its group on every rank
and returns {case: "ok" | traceback}; the pytest functions then assert per case. Cases do their
collectives first and their assertions last, so a failing assertion cannot strand a peer inside
a collective. References are computed on each rank by one process on the global batch.
"""

from __future__ import annotations

import copy
import itertools
import os
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import hora
import hora.torch as hvd

CaseFn = Callable[[], None]
CASES: dict[str, dict[str, tuple[CaseFn, tuple[int, ...]]]] = {}


def case(group: str, sizes: tuple[int, ...] = (2, 3)) -> Callable[[CaseFn], CaseFn]:
    def register(fn: CaseFn) -> CaseFn:
        CASES.setdefault(group, {})[fn.__name__] = (fn, sizes)
        return fn

    return register


def run_group(group: str) -> dict[str, str]:
    """The worker: run every case of `group` meant for this world size."""
    torch.set_num_threads(1)
    hvd.init()
    out = {}
    for name, (fn, sizes) in CASES[group].items():
        if hvd.size() not in sizes:
            continue
        try:
            fn()
            out[name] = "ok"
        except BaseException:
            out[name] = traceback.format_exc()
    hvd.shutdown()
    return out


def params(group: str) -> list[tuple[str, int]]:
    return [(name, np) for name, (_, sizes) in CASES[group].items() for np in sizes]


class Outcomes:
    """Launches one job per world size, on first use, and keeps every rank's outcomes."""

    def __init__(self, group: str) -> None:
        self.group = group
        self._by_np: dict[int, list[dict[str, str]]] = {}

    def check(self, name: str, np: int) -> None:
        if np not in self._by_np:
            env = {"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"}
            self._by_np[np] = hora.run(
                run_group, (self.group,), np=np, env=env, timeout=150, driver_log_verbosity="all"
            )
        for rank, outcomes in enumerate(self._by_np[np]):
            assert outcomes.get(name) == "ok", f"rank {rank} of {np}: {outcomes.get(name)}"


# --- shared helpers ---------------------------------------------------------------------------


def _mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))


def _batches(steps: int, per_rank: int = 4, seed: int = 1) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    n = per_rank * hvd.size()
    return [
        (torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g))
        for _ in range(steps)
    ]


def _shard(t: torch.Tensor) -> torch.Tensor:
    n = t.shape[0] // hvd.size()
    return t[hvd.rank() * n : (hvd.rank() + 1) * n]


def _assert_same_weights(a: nn.Module, b: nn.Module, atol: float = 1e-6) -> None:
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        torch.testing.assert_close(pa, pb, atol=atol, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def _equivalence(
    make_opt: Callable[..., torch.optim.Optimizer],
    steps: int = 3,
    atol: float = 1e-6,
    **kwargs: Any,
) -> None:
    """2+ ranks on equal slices of each batch == 1 process on the whole batch."""
    ref, model = _mlp(), _mlp()
    ref_opt = make_opt(ref.parameters())
    opt = hvd.DistributedOptimizer(
        make_opt(model.parameters()), named_parameters=model.named_parameters(), **kwargs
    )
    for x, y in _batches(steps):
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()
        opt.zero_grad()
        F.cross_entropy(model(_shard(x)), _shard(y)).backward()
        opt.step()
    _assert_same_weights(model, ref, atol)


def _sgd(p: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(p, lr=0.1, momentum=0.9)


# --- DistributedOptimizer ---------------------------------------------------------------------


@case("optimizer", sizes=(1, 2, 3))
def equivalence_sgd_momentum() -> None:
    _equivalence(_sgd)


@case("optimizer", sizes=(2, 3))
def equivalence_adam() -> None:
    _equivalence(lambda p: torch.optim.Adam(p, lr=0.01))


@case("optimizer", sizes=(2,))
def equivalence_unnamed_parameters() -> None:
    ref, model = _mlp(), _mlp()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    for x, y in _batches(2):
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()
        opt.zero_grad()
        F.cross_entropy(model(_shard(x)), _shard(y)).backward()
        opt.step()
    _assert_same_weights(model, ref)


@case("optimizer", sizes=(2,))
def unnamed_parameters_have_horovod_names() -> None:
    """Horovod's `_parameter_names`: unique per parameter, the same on every rank."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(
            [{"params": model[0].parameters()}, {"params": model[1].parameters()}], lr=0.1
        )
    )
    names = opt._parameter_names
    assert set(names) == set(model.parameters()) and len(set(names.values())) == len(names)
    everyone = hvd.allgather_object(sorted(names.values()))
    assert all(other == everyone[0] for other in everyone), everyone


@case("optimizer", sizes=(2,))
def fusion_threshold_zero_one_tensor_per_call() -> None:
    os.environ["HOROVOD_FUSION_THRESHOLD"] = "0"
    try:
        _equivalence(_sgd, steps=2)
    finally:
        del os.environ["HOROVOD_FUSION_THRESHOLD"]


@case("optimizer", sizes=(2,))
def fp16_compression() -> None:
    _equivalence(_sgd, atol=2e-3, compression=hvd.Compression.fp16)


@case("optimizer", sizes=(2, 3))
def gradient_predivide_factor() -> None:
    _equivalence(_sgd, gradient_predivide_factor=4.0)


@case("optimizer", sizes=(2,))
def op_sum_sums_gradients() -> None:
    ref, model = _mlp(), _mlp()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05),
        named_parameters=model.named_parameters(),
        op=hvd.Sum,
    )
    for x, y in _batches(2):
        ref_opt.zero_grad()
        sum(
            F.cross_entropy(ref(xs), ys)
            for xs, ys in zip(x.chunk(hvd.size()), y.chunk(hvd.size()), strict=True)
        ).backward()
        ref_opt.step()
        opt.zero_grad()
        F.cross_entropy(model(_shard(x)), _shard(y)).backward()
        opt.step()
    _assert_same_weights(model, ref)


@case("optimizer", sizes=(2, 3))
def groups_int() -> None:
    _equivalence(_sgd, groups=2)


@case("optimizer", sizes=(2,))
def groups_list_and_num_groups() -> None:
    captured: dict[str, Any] = {}

    def make(p: Any) -> torch.optim.Optimizer:
        params = list(p)
        captured["groups"] = [[params[0], params[5]], [params[2]]]
        return _sgd(params)

    # groups refers to the distributed model's own parameters: build it, then wrap.
    ref, model = _mlp(), _mlp()
    ref_opt = _sgd(ref.parameters())
    inner = make(model.parameters())
    opt = hvd.DistributedOptimizer(
        inner, named_parameters=model.named_parameters(), groups=captured["groups"]
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ref2, model2 = _mlp(), _mlp()
        opt2 = hvd.DistributedOptimizer(
            _sgd(model2.parameters()), num_groups=3, named_parameters=model2.named_parameters()
        )
    ref2_opt = _sgd(ref2.parameters())
    for x, y in _batches(2):
        for r, m, o, ro in ((ref, model, opt, ref_opt), (ref2, model2, opt2, ref2_opt)):
            ro.zero_grad()
            F.cross_entropy(r(x), y).backward()
            ro.step()
            o.zero_grad()
            F.cross_entropy(m(_shard(x)), _shard(y)).backward()
            o.step()
    _assert_same_weights(model, ref)
    _assert_same_weights(model2, ref2)
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)


@case("optimizer", sizes=(2, 3))
def backward_passes_per_step_accumulates() -> None:
    passes = 2
    ref, model = _mlp(), _mlp()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05),
        named_parameters=model.named_parameters(),
        backward_passes_per_step=passes,
    )
    for x, y in _batches(2, per_rank=4 * passes):
        # rank r, micro-batch k is piece r * passes + k of the global batch
        xs, ys = x.chunk(hvd.size() * passes), y.chunk(hvd.size() * passes)
        ref_opt.zero_grad()
        (
            sum(F.cross_entropy(ref(a), b) for a, b in zip(xs, ys, strict=True)) / hvd.size()
        ).backward()
        ref_opt.step()
        opt.zero_grad()
        for k in range(passes):
            i = hvd.rank() * passes + k
            F.cross_entropy(model(xs[i]), ys[i]).backward()
        opt.step()
    _assert_same_weights(model, ref)


@case("optimizer", sizes=(2,))
def too_many_backward_passes_raise() -> None:
    model = _mlp()
    opt = hvd.DistributedOptimizer(
        _sgd(model.parameters()),
        named_parameters=model.named_parameters(),
        backward_passes_per_step=2,
    )
    x, y = _batches(1)[0]
    for _ in range(2):
        F.cross_entropy(model(_shard(x)), _shard(y)).backward()
    error = None
    try:
        F.cross_entropy(model(_shard(x)), _shard(y)).backward()
    except AssertionError as exc:
        error = exc
    opt.synchronize()  # drain what the first two passes sent, on every rank
    assert error is not None and "more than backward_passes_per_step" in str(error), error


@case("optimizer", sizes=(2, 3))
def ranks_touch_different_parameters() -> None:
    class TwoHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.trunk, self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 3), nn.Linear(8, 3)

        def forward(self, x: torch.Tensor, head: int) -> torch.Tensor:
            h = torch.tanh(self.trunk(x))
            return self.a(h) if head == 0 else self.b(h)

    ref, model = TwoHeads(), TwoHeads()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    for x, y in _batches(2):
        ref_opt.zero_grad()
        pieces = zip(x.chunk(hvd.size()), y.chunk(hvd.size()), strict=True)
        (
            sum(F.cross_entropy(ref(a, r % 2), b) for r, (a, b) in enumerate(pieces)) / hvd.size()
        ).backward()
        ref_opt.step()
        opt.zero_grad()
        F.cross_entropy(model(_shard(x), hvd.rank() % 2), _shard(y)).backward()
        opt.step()
    _assert_same_weights(model, ref)


def _sparse_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(12, 3, sparse=True), nn.Flatten(), nn.Linear(6, 2))


def _sparse_equivalence(**kwargs: Any) -> None:
    ref, model = _sparse_model(), _sparse_model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5),
        named_parameters=model.named_parameters(),
        **kwargs,
    )
    g = torch.Generator().manual_seed(3)
    for _ in range(2):
        idx = torch.randint(0, 12, (3 * hvd.size(), 2), generator=g)
        y = torch.randint(0, 2, (3 * hvd.size(),), generator=g)
        ref_opt.zero_grad()
        F.cross_entropy(ref(idx), y).backward()
        ref_opt.step()
        opt.zero_grad()
        F.cross_entropy(model(_shard(idx)), _shard(y)).backward()
        assert model[0].weight.grad.is_sparse
        opt.step()
    _assert_same_weights(model, ref)


@case("optimizer", sizes=(2, 3))
def sparse_gradients_allgathered() -> None:
    _sparse_equivalence()


@case("optimizer", sizes=(2,))
def sparse_as_dense() -> None:
    _sparse_equivalence(sparse_as_dense=True)


@case("optimizer", sizes=(2,))
def zero_grad_while_pending_raises() -> None:
    model = _mlp()
    opt = hvd.DistributedOptimizer(
        _sgd(model.parameters()), named_parameters=model.named_parameters()
    )
    x, y = _batches(1)[0]
    F.cross_entropy(model(_shard(x)), _shard(y)).backward()
    error = None
    try:
        opt.zero_grad()
    except AssertionError as exc:
        error = exc
    opt.synchronize()
    opt.zero_grad()  # allowed once nothing is pending
    assert error is not None and "zero_grad() was called after loss.backward()" in str(error)


@case("optimizer", sizes=(2,))
def synchronize_then_skip_synchronize() -> None:
    ref, model = _mlp(), _mlp()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    (x, y), (x2, y2) = _batches(2)
    for xb, yb in ((x, y), (x2, y2)):
        ref_opt.zero_grad()
        F.cross_entropy(ref(xb), yb).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        ref_opt.step()
    with warnings.catch_warnings(record=True) as quiet:
        warnings.simplefilter("always")
        opt.zero_grad()
        F.cross_entropy(model(_shard(x)), _shard(y)).backward()
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)  # on averaged gradients
        with opt.skip_synchronize():
            opt.step()
    with warnings.catch_warnings(record=True) as loud:
        warnings.simplefilter("always")
        opt.zero_grad()
        F.cross_entropy(model(_shard(x2)), _shard(y2)).backward()
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()  # synchronizes again: same averaged values, plus the warning
    message = "optimizer.step() called without optimizer.skip_synchronize()"
    assert not [w for w in quiet if message in str(w.message)]
    assert [w for w in loud if message in str(w.message)]
    _assert_same_weights(model, ref)


@case("optimizer", sizes=(2,))
def wrapped_class_and_defaults() -> None:
    model = _mlp()
    inner = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9, weight_decay=1e-4)
    opt = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters())
    adam = hvd.DistributedOptimizer(torch.optim.Adam(_mlp().parameters(), lr=0.01))
    assert isinstance(opt, torch.optim.SGD) and type(opt).__name__ == "SGD"
    assert isinstance(adam, torch.optim.Adam) and not isinstance(adam, torch.optim.SGD)
    assert opt.defaults["lr"] == 0.3 and opt.param_groups[0]["momentum"] == 0.9
    assert all(
        a is b for a, b in zip(opt.param_groups[0]["params"], model.parameters(), strict=True)
    )


@case("optimizer", sizes=(2,))
def value_errors() -> None:
    def raises(exc: type[BaseException], text: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except exc as e:
            assert text in str(e), f"{text!r} not in {e!r}"
            return
        raise AssertionError(f"{exc.__name__} ({text}) not raised")

    model = _mlp()
    named = list(model.named_parameters())

    def make(**kw: Any) -> Callable[[], Any]:
        return lambda: hvd.DistributedOptimizer(_sgd(model.parameters()), **kw)

    raises(ValueError, "gradient_predivide_factor", make(op=hvd.Sum, gradient_predivide_factor=2.0))
    raises(ValueError, "backward_passes_per_step", make(backward_passes_per_step=0))
    raises(ValueError, "tuples", make(named_parameters=[[n, p] for n, p in named]))
    raises(ValueError, "unique", make(named_parameters=[("same", p) for _, p in named]))
    raises(ValueError, "not named", make(named_parameters=named[:-1]))
    raises(ValueError, "groups", make(groups=-1))
    raises(ValueError, "torch.Tensor", make(groups=[["not a tensor"]]))
    raises(ValueError, "only appear once", make(groups=[[named[0][1]], [named[0][1]]]))
    raises(NotImplementedError, "Adasum", make(op=hvd.Adasum))


@case("optimizer", sizes=(1,))
def one_rank_reduces_nothing() -> None:
    model = _mlp()
    opt = hvd.DistributedOptimizer(
        _sgd(model.parameters()), named_parameters=model.named_parameters()
    )
    x, y = _batches(1)[0]
    F.cross_entropy(model(x), y).backward()
    F.cross_entropy(model(x), y).backward()  # no hooks on one rank: no pass counting either
    before = [p.grad.clone() for p in model.parameters()]
    opt.synchronize()
    after = [p.grad for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    with opt.skip_synchronize():
        opt.step()


# --- functions: broadcast_parameters / _optimizer_state / _object, allgather_object -----------


@case("functions")
def broadcast_parameters_state_dict_from_nonzero_root() -> None:
    root = hvd.size() - 1
    model = _mlp(seed=hvd.rank())
    hvd.broadcast_parameters(model.state_dict(), root_rank=root)
    _assert_same_weights(model, _mlp(seed=root), atol=0)


@case("functions")
def broadcast_parameters_lists() -> None:
    named, plain = _mlp(seed=hvd.rank()), _mlp(seed=10 + hvd.rank())
    hvd.broadcast_parameters(list(named.named_parameters()), root_rank=0)
    hvd.broadcast_parameters(list(plain.parameters()), root_rank=0)
    _assert_same_weights(named, _mlp(seed=0), atol=0)
    _assert_same_weights(plain, _mlp(seed=10), atol=0)
    assert all(p.requires_grad and p.grad is None for p in named.parameters())


@case("functions")
def broadcast_parameters_generator_raises() -> None:
    try:
        hvd.broadcast_parameters(_mlp().parameters(), root_rank=0)
    except ValueError:
        return
    raise AssertionError("a generator was accepted")


_OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "SGD": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.1),
    "Adam": lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.9), weight_decay=0.1),
    "AdamW": lambda p: torch.optim.AdamW(p, lr=0.01, amsgrad=True),
    "RMSprop": lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True),
    "Adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1),
    "Adadelta": lambda p: torch.optim.Adadelta(p, lr=0.5),
}


def _state_snapshot(opt: torch.optim.Optimizer) -> dict[str, Any]:
    return copy.deepcopy(opt.state_dict())


def _assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["param_groups"] == b["param_groups"], (a["param_groups"], b["param_groups"])
    assert a["state"].keys() == b["state"].keys()
    for pid, entries in a["state"].items():
        assert entries.keys() == b["state"][pid].keys()
        for key, value in entries.items():
            other = b["state"][pid][key]
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, other), (pid, key)
            else:
                assert value == other and type(value) is type(other), (pid, key, value, other)


def _broadcast_optimizer_case(kind: str) -> None:
    """Root has stepped twice with its own lr; the others are fresh (empty state)."""
    model = _mlp()
    opt = _OPTIMIZERS[kind](model.parameters())
    for group in opt.param_groups:
        group["lr"] = group["lr"] * (1 + hvd.rank())  # a scalar option that differs
    x, y = _batches(2)[hvd.rank() % 2]
    if hvd.rank() == 0:
        for _ in range(2):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    before = [p.detach().clone() for p in model.parameters()]
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    unmoved = all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    states = hvd.allgather_object(_state_snapshot(opt))
    # one more identical step keeps every rank identical
    x, y = _batches(1, seed=9)[0]
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    weights = hvd.allgather_object([p.detach() for p in model.parameters()])
    assert unmoved, "initialising the empty state moved the weights"
    for state in states[1:]:
        _assert_same_state(states[0], state)
    for w in weights[1:]:
        assert all(torch.equal(a, b) for a, b in zip(weights[0], w, strict=True))


for _kind in _OPTIMIZERS:

    def _make(kind: str = _kind) -> None:
        _broadcast_optimizer_case(kind)

    _make.__name__ = f"broadcast_optimizer_state_{_kind.lower()}"
    case("functions")(_make)


@case("functions", sizes=(2,))
def broadcast_optimizer_state_option_types() -> None:
    model = _mlp()
    betas = (0.8, 0.9) if hvd.rank() == 0 else (0.5, 0.6)
    opt = torch.optim.Adam(
        model.parameters(), lr=0.01 * (hvd.rank() + 1), betas=betas, amsgrad=hvd.rank() == 0
    )
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    group = opt.param_groups[0]
    assert group["betas"] == (0.8, 0.9) and isinstance(group["betas"], tuple)
    assert group["lr"] == 0.01 and isinstance(group["lr"], float)
    assert group["amsgrad"] is True


@case("functions", sizes=(2,))
def broadcast_optimizer_state_of_distributed_optimizer() -> None:
    model = _mlp()
    opt = hvd.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )
    hvd.broadcast_optimizer_state(opt, root_rank=0)  # must not reduce, must not hang
    x, y = _batches(1)[0]
    opt.zero_grad()
    F.cross_entropy(model(_shard(x)), _shard(y)).backward()
    opt.step()
    weights = hvd.allgather_object([p.detach() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(weights[0], weights[-1], strict=True))


@case("functions", sizes=(2,))
def broadcast_optimizer_state_before_any_gradient() -> None:
    """Parameters without a gradient yet (one frozen): the state is made, the frozen one keeps
    None, the others keep the zero gradient Horovod leaves, which can be broadcast at once."""
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    model[1].bias.requires_grad_(False)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1),
        named_parameters=model.named_parameters(),
    )
    before = [p.detach().clone() for p in model.parameters()]
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert model[1].bias.grad is None
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p.detach(), b), "the weights moved"
        if p.requires_grad:
            assert torch.equal(p.grad, torch.zeros_like(p))
            assert torch.equal(hvd.broadcast(p.grad, root_rank=0), p.grad)
    assert len(opt.state) == 3


@case("functions", sizes=(2,))
def broadcast_optimizer_state_lbfgs_raises() -> None:
    opt = torch.optim.LBFGS(_mlp().parameters())
    try:
        hvd.broadcast_optimizer_state(opt, root_rank=0)
    except ValueError:
        return
    raise AssertionError("LBFGS was accepted")


@case("functions")
def broadcast_object_from_root() -> None:
    root = 1
    obj = (
        {"rank": hvd.rank(), "fn": lambda v: v + 1, "t": torch.arange(3)}
        if hvd.rank() == root
        else None
    )
    got = hvd.broadcast_object(obj, root_rank=root)
    named = hvd.broadcast_object("x" * 5000 if hvd.rank() == 0 else 7, name="big")
    assert got["rank"] == root and got["fn"](1) == 2 and torch.equal(got["t"], torch.arange(3))
    assert named == "x" * 5000


@case("functions")
def allgather_object_in_rank_order() -> None:
    got = hvd.allgather_object({"rank": hvd.rank(), "pad": "y" * (1000 * hvd.rank())})
    assert [g["rank"] for g in got] == list(range(hvd.size()))
    assert [len(g["pad"]) for g in got] == [1000 * r for r in range(hvd.size())]


# --- SyncBatchNorm ----------------------------------------------------------------------------


def _sbn_check(shape_tail: tuple[int, ...], momentum: float | None = 0.1, steps: int = 2) -> None:
    channels = shape_tail[0]
    counts = [r + 2 for r in range(hvd.size())]  # uneven batches across ranks
    start = sum(counts[: hvd.rank()])
    bn = (
        nn.BatchNorm1d(channels, momentum=momentum)
        if len(shape_tail) < 3
        else nn.BatchNorm2d(channels, momentum=momentum)
    )
    sbn = hvd.SyncBatchNorm(channels, momentum=momentum)
    with torch.no_grad():
        w = torch.randn(channels, generator=torch.Generator().manual_seed(5))
        for m in (bn, sbn):
            m.weight.copy_(w)
            m.bias.copy_(w.flip(0))
    g = torch.Generator().manual_seed(7)
    results = []
    for _ in range(steps):
        x = torch.randn(sum(counts), *shape_tail, generator=g) * 3 + 1
        c = torch.randn(sum(counts), *shape_tail, generator=g)
        x_ref = x.clone().requires_grad_()
        y_ref = bn(x_ref)
        (y_ref * c).sum().backward()
        x_loc = x[start : start + counts[hvd.rank()]].clone().requires_grad_()
        y = sbn(x_loc)
        (y * c[start : start + counts[hvd.rank()]]).sum().backward()
        w_grad = hvd.allreduce(sbn.weight.grad, op=hvd.Sum)
        b_grad = hvd.allreduce(sbn.bias.grad, op=hvd.Sum)
        sl = slice(start, start + counts[hvd.rank()])
        results.append(
            (
                y,
                y_ref[sl],
                x_loc.grad,
                x_ref.grad[sl],
                w_grad,
                bn.weight.grad.clone(),
                b_grad,
                bn.bias.grad.clone(),
            )
        )
        for m in (bn, sbn):
            m.zero_grad()
    for y, y_ref, gx, gx_ref, gw, gw_ref, gb, gb_ref in results:
        torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(gx, gx_ref, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(gw, gw_ref, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(gb, gb_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(sbn.running_mean, bn.running_mean)
    torch.testing.assert_close(sbn.running_var, bn.running_var)
    assert int(sbn.num_batches_tracked) == int(bn.num_batches_tracked) == steps
    # eval: running statistics, no communication
    sbn.eval()
    bn.eval()
    x = torch.randn(3, *shape_tail, generator=g)
    torch.testing.assert_close(sbn(x), bn(x))


@case("sync_batch_norm")
def sync_bn_2d_equals_global_batch_norm() -> None:
    _sbn_check((3, 4, 5))


@case("sync_batch_norm")
def sync_bn_1d_inputs() -> None:
    _sbn_check((4,))
    _sbn_check((4, 6))


@case("sync_batch_norm", sizes=(2,))
def sync_bn_cumulative_momentum() -> None:
    _sbn_check((3, 2, 2), momentum=None, steps=3)


@case("sync_batch_norm", sizes=(2,))
def sync_bn_rejects_1d_tensor() -> None:
    try:
        hvd.SyncBatchNorm(3)(torch.randn(3))
    except ValueError:
        return
    raise AssertionError("a 1-D input was accepted")


@case("sync_batch_norm", sizes=(2,))
def sync_bn_trains_like_batch_norm_with_distributed_optimizer() -> None:
    def net(norm: type[nn.Module]) -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Conv2d(1, 4, 3), norm(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3)
        )

    ref, model = net(nn.BatchNorm2d), net(hvd.SyncBatchNorm)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    g = torch.Generator().manual_seed(2)
    for _ in range(2):
        x = torch.randn(4 * hvd.size(), 1, 6, 6, generator=g)
        y = torch.randint(0, 3, (4 * hvd.size(),), generator=g)
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()
        opt.zero_grad()
        F.cross_entropy(model(_shard(x)), _shard(y)).backward()
        opt.step()
    _assert_same_weights(model, ref, atol=1e-5)
    torch.testing.assert_close(model[1].running_var, ref[1].running_var)


# --- elastic ----------------------------------------------------------------------------------


@case("elastic")
def elastic_sampler_shards_and_resumes() -> None:
    sampler = hvd.elastic.ElasticSampler(list(range(11)), shuffle=True, seed=3)
    first = list(sampler)
    shards = hvd.allgather_object(first)
    sampler.record_batch(0, 2)
    state = sampler.state_dict()
    resumed = hvd.elastic.ElasticSampler(list(range(11)), shuffle=True, seed=3)
    resumed.load_state_dict(
        hvd.allgather_object(state)[0]
        | {
            "processed_indices": set().union(
                *(s["processed_indices"] for s in hvd.allgather_object(state))
            )
        }
    )
    rest = hvd.allgather_object(list(resumed))
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    size = hvd.size()
    assert len(first) == len(sampler) == -(-11 // size)
    assert set(itertools.chain(*shards)) == set(range(11))
    done = set(itertools.chain(*(s[:2] for s in shards)))
    assert set(itertools.chain(*rest)) == set(range(11)) - done
    assert epoch1 != first and sampler.state_dict()["processed_indices"] == set()


@case("elastic")
def torch_state_commit_restore_sync() -> None:
    model = _mlp(seed=hvd.rank())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = hvd.elastic.TorchState(model, opt, epoch=hvd.rank(), batch=0)
    state.sync()  # rank 0's weights and plain values everywhere
    synced = [p.detach().clone() for p in model.parameters()]
    epoch_after_sync = state.epoch
    x, y = _batches(1)[0]
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    state.epoch, state.batch = 5, 3
    state.commit()
    committed = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    state.epoch = 6
    state.restore()
    restored = [p.detach().clone() for p in model.parameters()]
    assert epoch_after_sync == 0
    assert all(torch.equal(a, b) for a, b in zip(synced, _mlp(seed=0).parameters(), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(restored, committed, strict=True))
    assert (state.epoch, state.batch) == (5, 3)
    assert opt.state[next(model.parameters())]["momentum_buffer"] is not None


def _elastic_train(fail_at: int | None) -> tuple[list[torch.Tensor], int, int]:
    model = _mlp()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    state = hvd.elastic.TorchState(model, opt, epoch=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    failed = []

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> int:
        batches = _batches(4)
        while state.epoch < 4:
            if state.epoch == fail_at and not failed:
                failed.append(True)
                # a real collective failure seen by every rank: mismatched shapes
                hvd.allreduce(torch.ones(2 + hvd.rank()), name="elastic.mismatch")
            x, y = batches[state.epoch]
            state.optimizer.zero_grad()
            F.cross_entropy(state.model(_shard(x)), _shard(y)).backward()
            state.optimizer.step()
            state.epoch += 1
            state.commit()
        return state.epoch

    epochs = train(state)
    return [p.detach().clone() for p in model.parameters()], epochs, len(resets)


@case("elastic")
def elastic_run_recovers_from_a_collective_failure() -> None:
    clean, epochs_clean, resets_clean = _elastic_train(fail_at=None)
    recovered, epochs, resets = _elastic_train(fail_at=2)
    assert (epochs_clean, resets_clean) == (4, 0)
    assert (epochs, resets) == (4, 1)
    assert hvd.is_initialized() and hvd.size() >= 2
    assert all(torch.equal(a, b) for a, b in zip(clean, recovered, strict=True))
