"""What elastic training rolls back and resumes from: a model, an optimizer, an ElasticSampler,
a `hora.data` loader's position, plain values, and FSDP2-sharded models (Horovod's `TorchState`).

`commit()` keeps an in-memory copy and, under hora, the host's copy that outlives the ranks
(`hora.collectives.elastic`); `restore()` puts the in-memory one back; `sync()` broadcasts rank
0's state so every rank resumes from the same point. A sharded model (parameters that are
DTensors: FSDP2's `fully_shard`) has no whole copy on any rank, and a lost host takes its shards
with it, so its commit is a torch.distributed.checkpoint (DCP) written by every rank into
`checkpoint_dir`, which must be storage every host sees; the host's commit names it, and a new
attempt loads it at its own world size (DCP reshards on load).
"""

from __future__ import annotations

import copy
import os
import shutil
from collections.abc import Iterable
from typing import Any

import torch

from hora.collectives import rank
from hora.collectives.elastic import ObjectState
from hora.collectives.elastic import State as State
from hora.torch.elastic.sampler import ElasticSampler
from hora.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)

__all__ = ["ObjectState", "State", "TorchState"]

KEEP_SHARDED_COMMITS = 2  # a host's store may name the commit before the last


class _Handler:
    """Saves, restores and syncs one model, optimizer or sampler."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.save()

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def committed(self) -> Any:
        return self._saved

    def load_committed(self, saved: Any) -> None:
        self._saved = saved
        self.restore()

    def sync(self) -> None:
        raise NotImplementedError


class _ModelHandler(_Handler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_Handler):
    def sync(self) -> None:
        # Samples any rank recorded count as processed, with the batches every rank has done
        # since the last partition (a sync at a commit, when the world grows); rank 0's epoch
        # wins.
        processed = set().union(*allgather_object(self.value.processed_everywhere()))
        state = dict(self.value.state_dict(), processed_indices=processed)
        self.value.load_state_dict(broadcast_object(state, root_rank=0, name="elastic.sampler"))


class _PositionHandler(_Handler):
    """A value that keeps a position the same on every rank (`hora.data.Loader`): rank 0's."""

    def sync(self) -> None:
        state = broadcast_object(self.value.state_dict(), root_rank=0, name="elastic.position")
        self.value.load_state_dict(state)


class _ShardedHandler(_Handler):
    """A sharded model and the optimizers of its parameters, committed as a DCP checkpoint."""

    def __init__(
        self, model: torch.nn.Module, optimizers: list[torch.optim.Optimizer], directory: str
    ) -> None:
        self.optimizers = optimizers
        self.directory = directory
        self._path: str | None = None
        super().__init__(model)

    def save(self) -> None:
        """Nothing in memory: a commit writes the checkpoint (`commit_to`)."""

    def commit_to(self, index: int) -> None:
        import torch.distributed.checkpoint as dcp  # only for sharded models

        path = os.path.join(self.directory, f"commit-{index}")
        dcp.save(self._state_dict(), checkpoint_id=path)
        self._path = path
        if rank() == 0:
            old = os.path.join(self.directory, f"commit-{index - KEEP_SHARDED_COMMITS}")
            shutil.rmtree(old, ignore_errors=True)

    def restore(self) -> None:
        if self._path is None:
            return  # no commit yet: the state as it was made
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._state_dict()
        dcp.load(state, checkpoint_id=self._path)  # reshards to this world
        set_state_dict(
            self.value,
            self.optimizers,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizers"],
        )

    def committed(self) -> Any:
        return {"dcp": self._path}

    def load_committed(self, saved: Any) -> None:
        self._path = saved["dcp"]
        self.restore()

    def sync(self) -> None:
        """Each rank holds its own shards: nothing to broadcast."""

    def _state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizers = get_state_dict(self.value, self.optimizers)
        return {"model": model, "optimizers": optimizers}


def _is_sharded(module: torch.nn.Module) -> bool:
    """FSDP2 (`fully_shard`) and tensor parallelism make parameters DTensors."""
    return any(type(p).__name__ == "DTensor" for p in module.parameters())


def _handlers(
    values: dict[str, Any], checkpoint_dir: str | None
) -> tuple[dict[str, _Handler], dict[str, Any]]:
    """A handler for each model, optimizer and sampler in `values`; the rest are plain."""
    sharded = {n: v for n, v in values.items() if isinstance(v, torch.nn.Module) and _is_sharded(v)}
    if sharded and checkpoint_dir is None:
        raise ValueError(
            f"TorchState: {', '.join(sharded)} is sharded (FSDP2), so no rank holds it whole "
            "and a lost host takes its shards along: pass checkpoint_dir=, a folder every host "
            "sees, where each commit is written as a torch.distributed.checkpoint"
        )
    owner = {id(p): n for n, m in sharded.items() for p in m.parameters()}
    with_model: dict[str, list[torch.optim.Optimizer]] = {n: [] for n in sharded}
    handlers: dict[str, _Handler] = {}
    plain: dict[str, Any] = {}
    for name, value in values.items():
        if name in sharded:
            continue
        if isinstance(value, torch.optim.Optimizer):
            params = [p for group in value.param_groups for p in group["params"]]
            owners = {owner.get(id(p)) for p in params}
            if owners and None not in owners and len(owners) == 1:
                with_model[owners.pop()].append(value)  # type: ignore[index]
                continue
            handlers[name] = _OptimizerHandler(value)
        elif isinstance(value, torch.nn.Module):
            handlers[name] = _ModelHandler(value)
        elif isinstance(value, ElasticSampler):
            handlers[name] = _SamplerHandler(value)
        elif getattr(type(value), "hora_resumable", False):  # hora.data.Loader
            handlers[name] = _PositionHandler(value)
        else:
            plain[name] = value
    for name, model in sharded.items():
        handlers[name] = _ShardedHandler(model, with_model[name], str(checkpoint_dir))
    return handlers, plain


class TorchState(ObjectState):
    """State of a PyTorch training loop: `model`, `optimizer`, samplers, loaders, plain values.

    Models, optimizers, ElasticSamplers and `hora.data` loaders (also when passed as keyword
    arguments) are saved
    with deep copies of their state_dicts; other keyword arguments are plain values. A model
    sharded with FSDP2 is committed to `checkpoint_dir` (storage every host sees), with the
    optimizers of its parameters.
    """

    _handlers: dict[str, _Handler]  # set past __setattr__, which consults it

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        directory = os.fspath(checkpoint_dir) if checkpoint_dir is not None else None
        handlers, plain = _handlers(kwargs, directory)
        object.__setattr__(self, "_handlers", handlers)
        for name, value in kwargs.items():
            if name not in plain:
                object.__setattr__(self, name, value)
        super().__init__(**plain)

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].value = value
        super().__setattr__(name, value)

    def reforms_in_place(self) -> bool:
        """A sharded model's mesh is the world it was made in, and a lost rank took its shards:
        such a state restarts from its checkpoint instead."""
        return not any(isinstance(h, _ShardedHandler) for h in self._each())

    def _each(self) -> Iterable[_Handler]:
        return self._handlers.values()

    def commit(self) -> None:
        index = self.commit_index + 1
        for handler in self._each():
            if isinstance(handler, _ShardedHandler):
                handler.commit_to(index)
        super().commit()

    def save(self) -> None:
        for handler in self._each():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._each():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._each():
            handler.sync()
        super().sync()

    def committed(self) -> Any:
        handlers = {name: handler.committed() for name, handler in self._handlers.items()}
        return super().committed() | {"handlers": handlers}

    def load_committed(self, state: Any) -> None:
        for name, saved in state["handlers"].items():
            self._handlers[name].load_committed(saved)
        super().load_committed(state)
