"""Which gradients travel together in `hvd.DistributedOptimizer`: the parameters' names (the
same on every rank), Horovod's explicit `groups`, and otherwise buckets cut as DDP cuts them.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from typing import Any

import torch

# Buckets are what overlaps with backward: DDP's 25 MiB is a good trade between overlap and the
# per-call latency; HOROVOD_FUSION_THRESHOLD, when lower, caps them (0: one tensor per call).
_BUCKET_CAP_BYTES = 25 * 1024 * 1024
# DDP's first bucket (`dist._DEFAULT_FIRST_BUCKET_BYTES`): the gradients ready first (the last
# layers) travel on their own as soon as they reach 1 MiB, while backward computes the rest; a
# model of a few large tensors would otherwise send everything in one bucket at the very end.
_FIRST_BUCKET_CAP_BYTES = 1024 * 1024
# CPU gradients wait for 8 MiB: a bucket sent during backward costs a negotiation round and the
# loop thread's Python on the very cores that compute backward (a GPU host's cores are idle
# then). On a 2-core host, CNNs whose last layers hold 1-4 MiB ran 2-26% more steps/s sending
# them with the rest after backward, and a 26 MB MLP as many with 8 MiB as with 1 MiB
# (bench/first_bucket.py).
_CPU_FIRST_BUCKET_CAP_BYTES = 8 * 1024 * 1024
_DEFAULT_FUSION_THRESHOLD = 128 * 1024 * 1024

Bucket = tuple[torch.Tensor, ...]


def parameter_names(
    param_groups: list[dict[str, Any]], named_parameters: Iterable[tuple[str, torch.Tensor]] | None
) -> dict[torch.Tensor, str]:
    if named_parameters is None:
        return {
            p: f"allreduce.noname.{i}.{j}"
            for i, group in enumerate(param_groups)
            for j, p in enumerate(group["params"])
        }
    named = list(named_parameters)
    if any(not isinstance(item, tuple) for item in named):
        raise ValueError(
            "named_parameters should be a sequence of tuples (name, parameter), usually produced "
            "by model.named_parameters()."
        )
    dups = sorted(name for name, count in Counter(name for name, _ in named).items() if count > 1)
    if dups:
        raise ValueError(
            "Parameter names in named_parameters must be unique. "
            f"Found duplicates: {', '.join(dups)}"
        )
    named_ids = {id(p) for _, p in named}
    unnamed = [id(p) for g in param_groups for p in g["params"] if id(p) not in named_ids]
    if unnamed:
        raise ValueError(
            "named_parameters was specified, but one or more model parameters were not named. "
            f"Python object ids: {', '.join(map(str, unnamed))}"
        )
    return {p: name for name, p in named}


def check_groups(groups: Any) -> int | list[list[torch.Tensor]] | None:
    if groups is None:
        return None
    if isinstance(groups, list):
        seen: set[int] = set()
        for group in groups:
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor.")
                if id(p) in seen:
                    raise ValueError("A parameter can only appear once in groups.")
                seen.add(id(p))
        return groups
    if isinstance(groups, bool) or not isinstance(groups, int) or groups <= 0:
        raise ValueError(
            "groups should be a non-negative integer or a list of list of torch.Tensor."
        )
    return groups


def size_buckets(params: list[torch.Tensor]) -> list[Bucket]:
    """Consecutive parameters (in backward order) of one dtype and device, up to the cap; the
    first bucket closes once it holds 1 MiB (8 MiB on CPU), the tensor that reaches it
    included, as DDP's."""
    threshold = int(os.environ.get("HOROVOD_FUSION_THRESHOLD", _DEFAULT_FUSION_THRESHOLD))
    cap = min(threshold, _BUCKET_CAP_BYTES)
    on_cpu = bool(params) and params[0].device.type == "cpu"
    first_cap = min(cap, _CPU_FIRST_BUCKET_CAP_BYTES if on_cpu else _FIRST_BUCKET_CAP_BYTES)
    buckets: list[list[torch.Tensor]] = []
    size = 0
    closed = False  # the first bucket, once full
    for p in params:
        nbytes = p.numel() * p.element_size()
        current = buckets[-1] if buckets else None
        if (
            current is None
            or closed
            or current[0].dtype != p.dtype
            or current[0].device != p.device
            or size + nbytes > cap
        ):
            buckets.append([p])
            size = nbytes
        else:
            current.append(p)
            size += nbytes
        closed = len(buckets) == 1 and size >= first_cap
    return [tuple(b) for b in buckets]


def explicit_groups(
    params: list[torch.Tensor], groups: int | list[list[torch.Tensor]]
) -> list[Bucket]:
    """Horovod's `groups`: N even slices, or the given lists plus one group per other parameter."""
    if isinstance(groups, int):
        d, r = divmod(len(params), groups)
        slices = [params[i * d + min(i, r) : (i + 1) * d + min(i + 1, r)] for i in range(groups)]
        return [tuple(s) for s in slices if s]
    trainable = {id(p) for p in params}
    out = [tuple(p for p in group if id(p) in trainable) for group in groups]
    grouped = {id(p) for group in out for p in group}
    out += [(p,) for p in params if id(p) not in grouped]
    return [g for g in out if g]
