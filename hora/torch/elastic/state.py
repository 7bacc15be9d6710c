"""What elastic training rolls back and resumes from: a model, an optimizer, an ElasticSampler,
a `hora.data` loader's position, plain values, and FSDP2-sharded models (Horovod's `TorchState`).

`commit()` keeps an in-memory copy and, under hora, the host's copy that outlives the ranks
(`hora.collectives.elastic`); `restore()` puts the in-memory one back; `sync()` broadcasts rank
0's state so every rank resumes from the same point. A sharded model (parameters that are
DTensors: FSDP2's `fully_shard`) has no whole copy on any rank, and a lost host takes its shards
with it, so its commit is a torch.distributed.checkpoint (DCP) written by every rank into
`checkpoint_dir`, which must be storage every host sees; the host's commit names it, and a new
attempt loads it at its own world size (DCP reshards on load). hora cannot move an FSDP2 module
to another world's mesh (`fully_shard` applies once, and its DTensors keep their mesh), so a
world re-formed in place keeps a sharded state only with `reshard=`: the user's function builds
the model and optimizer anew in the new world, and every rank of it loads the last checkpoint.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from hora import environment
from hora.collectives import rank, size
from hora.collectives.elastic import ObjectState
from hora.collectives.elastic import State as State
from hora.storage import Location
from hora.torch.elastic.sampler import ElasticSampler
from hora.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)

__all__ = ["ObjectState", "Reshard", "State", "TorchState"]

log = logging.getLogger(__name__)

#: `reshard=`: given the new world's size, the sharded model and its optimizer built anew in it,
#: as (model, optimizer) for the state's `model` and `optimizer`, or by the state's names
Reshard = Callable[[int], tuple[torch.nn.Module, torch.optim.Optimizer] | Mapping[str, Any]]

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
    """A sharded model and the optimizers of its parameters, committed as a DCP checkpoint.

    Loading needs every rank of the world (DCP reshards over it), so `sync()` loads rank 0's
    checkpoint on every rank when any rank's model does not hold it yet: one rebuilt in a
    re-formed world (`rebuild`), or a new rank's.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizers: dict[str, torch.optim.Optimizer],
        directory: Location,
    ) -> None:
        self.optimizers = optimizers  # by the state's names
        self.directory = directory
        self._path: str | None = None
        self._loaded: str | None = None  # the checkpoint the model holds now
        super().__init__(model)

    def save(self) -> None:
        """Nothing in memory: a commit writes the checkpoint (`commit_to`)."""

    def commit_to(self, index: int) -> None:
        import torch.distributed.checkpoint as dcp  # only for sharded models

        path = self.directory.location(f"commit-{index}")
        dcp.save(self._state_dict(), checkpoint_id=path)
        self._path = self._loaded = path
        if rank() == 0:
            with contextlib.suppress(OSError):
                self.directory.remove_tree(f"commit-{index - KEEP_SHARDED_COMMITS}")

    def restore(self) -> None:
        if self._path is None:
            return  # no commit yet: the state as it was made
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._state_dict()
        dcp.load(state, checkpoint_id=self._path)  # reshards to this world
        set_state_dict(
            self.value,
            list(self.optimizers.values()),
            model_state_dict=state["model"],
            optim_state_dict=state["optimizers"],
        )
        self._loaded = self._path

    def rebuild(self, model: torch.nn.Module, optimizers: dict[str, torch.optim.Optimizer]) -> None:
        """The model and optimizers made anew in a re-formed world: they hold no commit yet."""
        self.value, self.optimizers, self._loaded = model, optimizers, None

    def committed(self) -> Any:
        return {"dcp": self._path}

    def load_committed(self, saved: Any) -> None:
        self._path = saved["dcp"]
        self.restore()

    def sync(self) -> None:
        """Each rank holds its own shards; a rank whose model lacks rank 0's checkpoint (a
        rebuilt or new one) makes every rank load it, since the load is collective."""
        self._path = broadcast_object(self._path, root_rank=0, name="elastic.sharded")
        stale = allgather_object(self._path is not None and self._loaded != self._path)
        if any(stale):
            self.restore()

    def _state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizers = get_state_dict(self.value, list(self.optimizers.values()))
        return {"model": model, "optimizers": optimizers}


def _is_sharded(module: torch.nn.Module) -> bool:
    """FSDP2 (`fully_shard`) and tensor parallelism make parameters DTensors."""
    return any(type(p).__name__ == "DTensor" for p in module.parameters())


def _handlers(
    values: dict[str, Any], checkpoint_dir: Location | None
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
    with_model: dict[str, dict[str, torch.optim.Optimizer]] = {n: {} for n in sharded}
    handlers: dict[str, _Handler] = {}
    plain: dict[str, Any] = {}
    for name, value in values.items():
        if name in sharded:
            continue
        if isinstance(value, torch.optim.Optimizer):
            params = [p for group in value.param_groups for p in group["params"]]
            owners = {owner.get(id(p)) for p in params}
            if owners and None not in owners and len(owners) == 1:
                with_model[owners.pop()][name] = value  # type: ignore[index]
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
        assert checkpoint_dir is not None
        handlers[name] = _ShardedHandler(model, with_model[name], checkpoint_dir)
    return handlers, plain


def _by_name(built: Any) -> Mapping[str, Any]:
    """What `reshard` returned, by the state's names."""
    if isinstance(built, Mapping):
        return built
    model, optimizer = built
    return {"model": model, "optimizer": optimizer}


class TorchState(ObjectState):
    """State of a PyTorch training loop: `model`, `optimizer`, samplers, loaders, plain values.

    Models, optimizers, ElasticSamplers and `hora.data` loaders (also when passed as keyword
    arguments) are saved
    with deep copies of their state_dicts; other keyword arguments are plain values. A model
    sharded with FSDP2 is committed to `checkpoint_dir` (storage every host sees), with the
    optimizers of its parameters. With `reshard(size)`, which builds the sharded model and its
    optimizer anew in a world of `size` (`Reshard`), a world re-formed in place keeps them: the
    survivors (or the running ranks, to grow) rebuild them and every rank loads the last
    checkpoint; without it, such a state restarts every rank.
    """

    _handlers: dict[str, _Handler]  # set past __setattr__, which consults it
    _reshard: Reshard | None

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        reshard: Reshard | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        directory = (
            Location.parse(checkpoint_dir, "TorchState checkpoint_dir")
            if checkpoint_dir is not None
            else None
        )
        handlers, plain = _handlers(kwargs, directory)
        object.__setattr__(self, "_handlers", handlers)
        object.__setattr__(self, "_reshard", reshard)
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
        only `reshard=` can make it anew in a re-formed world; else the state restarts from its
        checkpoint."""
        sharded = [n for n, h in self._handlers.items() if isinstance(h, _ShardedHandler)]
        if not sharded or self._reshard is not None:
            return True
        if environment.current().elastic:
            log.warning(
                "TorchState: %s is sharded (FSDP2), so a lost rank restarts every rank; pass "
                "reshard=fn, where fn(size) builds and shards the model and its optimizer in a "
                "world of that size, for the survivors to go on in place",
                ", ".join(sharded),
            )
        return False

    def reformed(self) -> None:
        """Rebuild each sharded model and its optimizers in the new world (`reshard`); they
        load the last checkpoint in `restore()` or `sync()`."""
        sharded = {n: h for n, h in self._handlers.items() if isinstance(h, _ShardedHandler)}
        if not sharded or self._reshard is None:
            return
        built = _by_name(self._reshard(size()))
        for name, handler in sharded.items():
            wanted = [name, *handler.optimizers]
            missing = [n for n in wanted if n not in built]
            if missing:
                raise ValueError(
                    f"TorchState: reshard returned no {', '.join(missing)}: return "
                    f"{{{', '.join(repr(n) + ': ...' for n in wanted)}}} (or (model, optimizer) "
                    "when they are the state's model and optimizer)"
                )
            handler.rebuild(built[name], {n: built[n] for n in handler.optimizers})
            for n in wanted:
                object.__setattr__(self, n, built[n])

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
