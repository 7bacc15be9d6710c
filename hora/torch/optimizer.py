"""`hvd.DistributedOptimizer`: average gradients across ranks while backward is still running.

A hook on each parameter's gradient accumulation counts backward passes; when a parameter's
gradient is final for this step it joins its bucket, and a full bucket is sent as one grouped
in-place allreduce, so the loop moves it in one fused buffer while autograd keeps computing the
gradients of earlier layers. `synchronize()` (called by `step()`) sends the buckets that never
filled (parameters this rank did not use get zero gradients, so every rank submits the same
operations) and waits for all of them.
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from hora.collectives.framework import resolve_op
from hora.collectives.ops import submit_allreduce
from hora.torch._buckets import Bucket, check_groups, explicit_groups, parameter_names, size_buckets
from hora.torch._flat import flatten, unflatten
from hora.torch.compression import Compression, Compressor
from hora.torch.functions import broadcast_object
from hora.torch.mpi_ops import (
    Adasum,
    Average,
    ProcessSet,
    global_process_set,
    sparse_allreduce_async,
    synchronize,
)

__all__ = ["DistributedOptimizer"]

# The mixin below is only ever combined with an optimizer class (see DistributedOptimizer): to a
# type checker it is one, to Python a plain object until then.
if TYPE_CHECKING:
    _Optimizer = torch.optim.Optimizer
else:
    _Optimizer = object

_TOO_MANY_PASSES = (
    "Gradients were computed more than backward_passes_per_step times before call to step(). "
    "Increase backward_passes_per_step to accumulate gradients locally."
)
_ZERO_GRAD_PENDING = (
    "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
    "optimizer.synchronize(). This is prohibited as it can cause a race condition."
)
_STEP_AFTER_SYNC = (
    "optimizer.step() called without optimizer.skip_synchronize() context after "
    "optimizer.synchronize(). This can cause training slowdown. You may want to consider using "
    "optimizer.skip_synchronize() context if you use optimizer.synchronize() in your code."
)


class _Pending:
    """One submitted bucket: per flat buffer sent, the (parameter, gradient) pairs inside it."""

    __slots__ = ("ctxs", "handle", "members", "sent")

    def __init__(
        self,
        handle: Any,
        members: list[list[tuple[torch.Tensor, torch.Tensor]]],
        sent: list[torch.Tensor],
        ctxs: list[Any],
    ) -> None:
        self.handle, self.members, self.sent, self.ctxs = handle, members, sent, ctxs


class _DistributedOptimizer(_Optimizer):
    """Mixed in before the wrapped optimizer's class, so `isinstance(opt, type(wrapped))` holds."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
        compression: type[Compressor],
        backward_passes_per_step: int,
        op: int,
        gradient_predivide_factor: float,
        groups: int | list[list[torch.Tensor]] | None,
        sparse_as_dense: bool,
        process_set: ProcessSet,
    ) -> None:
        init: Callable[..., None] = type(optimizer).__init__  # each optimizer has its own
        try:  # keep the wrapped optimizer's defaults for later add_param_group calls
            init(self, optimizer.param_groups, **optimizer.defaults)
        except TypeError:
            init(self, optimizer.param_groups)
            self.defaults = dict(optimizer.defaults)
        self.state.update(optimizer.state)

        self._compression = compression
        self._names = parameter_names(self.param_groups, named_parameters)
        self._groups = check_groups(groups)
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set

        # Buckets and hooked parameters ("slots") are referred to by index: hashing a tensor is
        # a Python __hash__ call, and every hook of every step would pay a few of them.
        self._slots: list[torch.Tensor] = []  # the parameters with a hook, bucket by bucket
        self._slot_bucket: list[int] = []  # slot -> its bucket
        self._delays: list[int] = []  # slot -> backward passes still to come this step
        self._buckets: list[Bucket] = []
        self._uniform: list[bool] = []  # bucket -> one dtype and device (the fast path)
        self._ready: list[int] = []
        self._pending: dict[int, _Pending] = {}
        self._sparse: dict[torch.Tensor, Callable[[], torch.Tensor]] = {}
        self._fired = False
        self._hook_handles: list[Any] = []
        self._synchronized = False
        self._should_synchronize = True

        ps_size = (process_set.size() or 0) if process_set.included() else 0
        self._reducing = ps_size > 1 or (ps_size == 1 and os.environ.get("HOROVOD_ELASTIC") == "1")
        if self._reducing:
            self._make_buckets()
            self._register_hooks()

    @property
    def _parameter_names(self) -> dict[torch.Tensor, str]:
        """Horovod's attribute for the parameter -> name map: scripts and tests read it."""
        return self._names

    # --- set-up -------------------------------------------------------------------------------
    def _trainable(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"] if p.requires_grad]

    def _make_buckets(self) -> None:
        params = self._trainable()
        if self._groups is None:
            buckets = size_buckets(list(reversed(params)))
        else:
            # Rank 0's order decides group membership, so every rank forms the same groups.
            order = broadcast_object(
                [self._names[p] for p in params],
                root_rank=self.process_set.ranks[0] if self.process_set.ranks else 0,
                name="DistributedOptimizer.groups",
                process_set=self.process_set,
            )
            position = {name: i for i, name in enumerate(order)}
            params.sort(key=lambda p: position.get(self._names[p], len(position)))
            buckets = explicit_groups(params, self._groups)
        for index, bucket in enumerate(buckets):
            self._buckets.append(bucket)
            self._uniform.append(len({(p.dtype, p.device) for p in bucket}) == 1)
            self._ready.append(0)
            for p in bucket:
                self._slots.append(p)
                self._slot_bucket.append(index)
        self._delays = [self.backward_passes_per_step] * len(self._slots)

    def _register_hooks(self) -> None:
        ref = weakref.ref(self)

        def hook_for(slot: int) -> Callable[[torch.Tensor], None]:
            def hook(_: torch.Tensor) -> None:
                opt = ref()
                if opt is not None:
                    opt._on_grad_ready(slot)

            return hook

        for slot, p in enumerate(self._slots):
            self._hook_handles.append(p.register_post_accumulate_grad_hook(hook_for(slot)))

    # --- during backward ----------------------------------------------------------------------
    def _on_grad_ready(self, slot: int) -> None:
        delay = self._delays[slot]
        if delay <= 0:
            raise AssertionError(_TOO_MANY_PASSES)
        self._fired = True
        self._delays[slot] = delay = delay - 1
        if delay > 0:
            return
        index = self._slot_bucket[slot]
        if index in self._pending:
            return
        self._ready[index] += 1
        if self._ready[index] == len(self._buckets[index]):
            self._submit(index)

    def _plain_group(self, index: int) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """Bucket `index`'s (parameter, gradient) pairs when every gradient is dense and
        contiguous and the bucket has one dtype and device (as buckets cut by size do), else
        None. Missing gradients become zeros on the way, as in `_submit`."""
        if not self._uniform[index]:
            return None
        group = []
        for p in self._buckets[index]:
            grad = p.grad
            if grad is None:  # not used on this rank: another rank may have used it
                grad = p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
            elif grad.is_sparse or not grad.is_contiguous():
                return None
            group.append((p, grad))
        return group

    def _scale_factors(self) -> tuple[float, float]:
        if self.op == Average:  # the loop divides by size on top of the postscale
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _by_kind(
        self, index: int
    ) -> dict[tuple[torch.dtype, torch.device], list[tuple[torch.Tensor, torch.Tensor]]]:
        """Bucket `index`'s (parameter, dense gradient) pairs by dtype and device; its sparse
        gradients (unless sparse_as_dense) are sent here, on their own."""
        plain = self._plain_group(index)
        if plain:
            return {(plain[0][1].dtype, plain[0][1].device): plain}
        kinds: dict[tuple[torch.dtype, torch.device], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for p in self._buckets[index]:
            if p.grad is None:  # not used on this rank: another rank may have used it
                p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
            grad = p.grad
            if grad.is_sparse:
                if not self.sparse_as_dense:
                    if p not in self._sparse:
                        self._sparse[p] = self._sparse_allreduce_async(p, grad)
                    continue
                grad = grad.to_dense()
            elif not grad.is_contiguous():
                grad = grad.contiguous()
            kinds.setdefault((grad.dtype, grad.device), []).append((p, grad))
        return kinds

    def _submit(self, index: int) -> None:
        """Send bucket `index`: one flat buffer per dtype, so the loop gets one tensor per kind
        (fewer names to match, one copy in and one out) and compression casts once."""
        kinds = self._by_kind(index)
        if not kinds:
            self._pending[index] = _Pending(None, [], [], [])
            return
        members, sent, ctxs = [], [], []
        for group in kinds.values():
            tensor, ctx = self._compression.compress(flatten(group))
            members.append(group)
            sent.append(tensor)
            ctxs.append(ctx)
        pre, post = self._scale_factors()
        # Every bucket goes to the loop with a flush, so it travels at once instead of after a
        # gathering cycle: it is one fused operation already, and waiting would only delay its
        # overlap with backward (and wake the loop thread twice); the step's last bucket (or
        # one sent by synchronize()) is waited for next.
        handle = submit_allreduce(  # grouped, in place
            sent,
            f"DistributedOptimizer.{self._names[members[0][0][0]]}",
            resolve_op(None, self.op),
            pre,
            post,
            self.process_set,
            True,
            True,
            flush=True,
        )
        self._pending[index] = _Pending(handle, members, sent, ctxs)

    def _sparse_allreduce_async(
        self, p: torch.Tensor, grad: torch.Tensor
    ) -> Callable[[], torch.Tensor]:
        """Sparse gradients travel as an allgather of indices and values, summed by coalescing."""
        return sparse_allreduce_async(
            grad,
            name=f"DistributedOptimizer.{self._names[p]}",
            op=self.op,
            process_set=self.process_set,
        )

    # --- public API ---------------------------------------------------------------------------
    def synchronize(self) -> None:
        """Finish every reduction of this step; parameters whose hook never fired are sent too."""
        if not self._reducing:
            self._synchronized = True
            return
        for index in range(len(self._buckets)):
            if index not in self._pending:
                self._submit(index)
        try:
            for pending in self._pending.values():
                if pending.handle is None:
                    continue
                synchronize(pending.handle)
                for group, tensor, ctx in zip(
                    pending.members, pending.sent, pending.ctxs, strict=True
                ):
                    unflatten(group, self._compression.decompress(tensor, ctx))
            for p, finish in self._sparse.items():
                p.grad = finish()
        finally:
            self._reset_step()
        self._synchronized = True

    def _reset_step(self) -> None:
        self._pending.clear()
        self._sparse.clear()
        self._fired = False
        self._ready = [0] * len(self._buckets)
        self._delays = [self.backward_passes_per_step] * len(self._slots)

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Inside this block `step()` does not synchronize: call `synchronize()` yourself first
        (to clip the averaged gradients, for instance)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(_STEP_AFTER_SYNC, stacklevel=2)
            self.synchronize()
        self._synchronized = False
        return self._step_without_sync(closure)

    def _step_without_sync(self, closure: Callable[[], float] | None = None) -> Any:
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._pending or self._fired:
            raise AssertionError(_ZERO_GRAD_PENDING)
        super().zero_grad(set_to_none)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._reset_step()
        self._synchronized = False
        self._should_synchronize = True
        super().load_state_dict(state_dict)

    def set_backward_passes_per_step(self, passes: int) -> None:
        if passes <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = passes
        self._delays = [passes] * len(self._slots)


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    compression: type[Compressor] = Compression.none,
    backward_passes_per_step: int = 1,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: int | list[list[torch.Tensor]] | None = None,
    sparse_as_dense: bool = False,
    process_set: ProcessSet = global_process_set,
) -> torch.optim.Optimizer:
    """Wrap `optimizer` so `step()` applies gradients averaged over the process set's ranks.

    The result is an instance of a subclass of `type(optimizer)` built from its param_groups.
    """
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn(
            "Parameter `num_groups` has been replaced by `groups` and will be removed.",
            DeprecationWarning,
            stacklevel=2,
        )
        if groups is None:
            groups = num_groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if op == Adasum and process_set.included() and (process_set.size() or 1) > 1:
        raise NotImplementedError("op=Adasum is not implemented in hora yet; use Average or Sum")
    base = type(optimizer)
    cls = type(base.__name__, (_DistributedOptimizer, base), {})
    return cls(
        optimizer,
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        groups,
        sparse_as_dense,
        process_set,
    )
