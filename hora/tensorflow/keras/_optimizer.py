"""Keras 3's DistributedOptimizer: any Keras 3 optimizer, with gradients averaged over the ranks.

Keras 3 optimizers no longer call the gradient hooks Horovod overrides (`get_gradients`,
`_aggregate_gradients`): `model.fit` computes the gradients and calls `apply()`. Every update
(also one made from accumulated gradients) clips its gradients in `_clip_gradients` right before
applying them, so that is where the gradients are reduced, once per update, before clipping as
in Horovod. `backward_passes_per_step` is Keras 3's own `gradient_accumulation_steps`: the
gradients are summed locally (Horovod's default; averaged with `average_aggregated_gradients`)
and reduced once every that many steps.
"""

from __future__ import annotations

from typing import Any

import keras

from hora.collectives import Average, ProcessSet, Sum, global_process_set
from hora.tensorflow.compression import Compression, Compressor
from hora.tensorflow.gradient_tape import local_variables, reduce_gradients

__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "distributed_class"]


class _DistributedMethods:
    """What a wrapped optimizer's class gains (copied into a subclass of its own class)."""

    _hora: dict[str, Any]

    def _backend_apply_gradients(self, grads: Any, trainable_variables: Any) -> Any:
        # object.__setattr__: Keras tracks variables set as attributes (and would save them).
        object.__setattr__(self, "_hora_variables", list(trainable_variables))
        return super(type(self), self)._backend_apply_gradients(  # type: ignore[misc]
            grads, trainable_variables
        )

    def _clip_gradients(self, grads: Any) -> Any:
        options = _options_of(self)
        variables = getattr(self, "_hora_variables", None) or [None] * len(grads)
        reduced = reduce_gradients(
            list(grads),
            variables,
            compression=options["compression"],
            sparse_as_dense=options["sparse_as_dense"],
            op=Sum if options["op"] == Sum else Average,
            gradient_predivide_factor=options["gradient_predivide_factor"],
            groups=options["groups"],
            process_set=options["process_set"],
            local_sources=frozenset(id(v) for v in options["local"]),
            scale_local_gradients=options["scale_local_gradients"],
            postscale_factor=options["postscale"],
        )
        return super(type(self), self)._clip_gradients(reduced)  # type: ignore[misc]

    def register_local_var(self, var: Any) -> None:
        """A variable each rank keeps to itself: its gradient is not reduced (only scaled)."""
        _options_of(self)["local"].append(var)


def _options_of(optimizer: Any) -> dict[str, Any]:
    """The optimizer's options; Horovod's defaults for one made another way than by
    DistributedOptimizer (e.g. `from_config` of its class: the options are no part of a config)."""
    options = getattr(optimizer, "_hora", None)
    if options is None:
        options = default_options()
        object.__setattr__(optimizer, "_hora", options)
    return options


_classes: dict[type, type] = {}


def distributed_class(base: type[Any]) -> type[Any]:
    """The distributed subclass of a Keras optimizer class (one per class, named as it)."""
    cls = _classes.get(base)
    if cls is None:
        methods = {k: v for k, v in _DistributedMethods.__dict__.items() if not k.startswith("__")}
        # Saved models name the base class (module and name), so keras.models.load_model
        # (or hvd.load_model, which wraps it again) finds it without hora.
        methods.update(__module__=base.__module__, __qualname__=base.__qualname__)
        cls = _classes[base] = type(base.__name__, (base,), methods)
    return cls


def _check_hooks(optimizer: Any) -> None:
    for hook in ("_backend_apply_gradients", "_clip_gradients"):
        if not callable(getattr(optimizer, hook, None)):
            raise TypeError(
                f"{type(optimizer).__name__} has no {hook}(): hora.tensorflow.keras needs a "
                f"Keras 3 optimizer (keras {keras.__version__} is installed)"
            )


def make_distributed(optimizer: Any, options: dict[str, Any]) -> Any:
    """Turn `optimizer` itself into its distributed subclass (keeps its variables: load_model)."""
    _check_hooks(optimizer)
    optimizer.__class__ = distributed_class(type(optimizer))
    object.__setattr__(optimizer, "_hora", options)
    return optimizer


def _options(
    compression: type[Compressor],
    sparse_as_dense: bool,
    gradient_predivide_factor: float,
    op: int,
    backward_passes_per_step: int,
    average_aggregated_gradients: bool,
    groups: Any,
    process_set: ProcessSet,
    scale_local_gradients: bool,
) -> dict[str, Any]:
    # Keras averages accumulated gradients; Horovod sums them unless asked to average.
    summed = backward_passes_per_step > 1 and not average_aggregated_gradients
    return {
        "compression": compression,
        "sparse_as_dense": sparse_as_dense,
        "gradient_predivide_factor": float(gradient_predivide_factor),
        "op": op,
        "groups": groups,
        "process_set": process_set,
        "scale_local_gradients": scale_local_gradients,
        "local": [],
        "postscale": float(backward_passes_per_step) if summed else 1.0,
    }


def default_options() -> dict[str, Any]:
    return _options(Compression.none, False, 1.0, Average, 1, False, None, global_process_set, True)


def DistributedOptimizer(
    optimizer: keras.optimizers.Optimizer,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: type[Compressor] = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: int = Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
    scale_local_gradients: bool = True,
) -> keras.optimizers.Optimizer:
    """A new optimizer of `optimizer`'s class and config whose updates use the gradients
    reduced (`op`, Average by default) over the ranks of `process_set`; `model.compile(
    optimizer=hvd.DistributedOptimizer(opt))` then `model.fit` trains data-parallel.
    `device_dense`/`device_sparse` are accepted and ignored."""
    del device_dense, device_sparse
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"DistributedOptimizer wraps a Keras 3 optimizer (keras.optimizers.*), got "
            f"{type(optimizer).__name__}; for a custom loop use hvd.DistributedGradientTape"
        )
    if op not in (Average, Sum):
        raise ValueError("op currently only supports Average and Sum")
    if isinstance(backward_passes_per_step, bool) or int(backward_passes_per_step) < 1:
        raise ValueError(
            f"backward_passes_per_step must be a positive int, got {backward_passes_per_step!r}"
        )
    _check_hooks(optimizer)
    if num_groups and groups is None:
        groups = num_groups
    config = optimizer.get_config()
    if backward_passes_per_step > 1:
        if config.get("gradient_accumulation_steps"):
            raise ValueError(
                "the optimizer already accumulates gradients (gradient_accumulation_steps); "
                "use that or backward_passes_per_step, not both"
            )
        config["gradient_accumulation_steps"] = int(backward_passes_per_step)
    config["name"] = name or f"Distributed{type(optimizer).__name__}"
    wrapped = distributed_class(type(optimizer)).from_config(config)
    object.__setattr__(
        wrapped,
        "_hora",
        _options(
            compression,
            sparse_as_dense,
            gradient_predivide_factor,
            op,
            int(backward_passes_per_step),
            average_aggregated_gradients,
            groups,
            process_set,
            scale_local_gradients,
        ),
    )
    return wrapped


def PartialDistributedOptimizer(
    optimizer: keras.optimizers.Optimizer,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: type[Compressor] = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: int = Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
    local_layers: Any = None,
    scale_local_gradients: bool = True,
) -> keras.optimizers.Optimizer:
    """A DistributedOptimizer whose `local_layers`' (a Keras layer or a list) variables stay
    local: their gradients are not reduced, only divided by the set size when
    `scale_local_gradients`."""
    local = local_variables(local_layers)
    wrapped = DistributedOptimizer(
        optimizer,
        name=name,
        device_dense=device_dense,
        device_sparse=device_sparse,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor,
        op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        groups=groups,
        process_set=process_set,
        scale_local_gradients=scale_local_gradients,
    )
    for var in local:
        wrapped.register_local_var(var)
    return wrapped
