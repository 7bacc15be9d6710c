"""`DistributedGradientTape`: a `tf.GradientTape` whose `gradient()` averages over the ranks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from hora.collectives import Adasum, Average, ProcessSet, Sum, global_process_set
from hora.tensorflow import mpi_ops
from hora.tensorflow.compression import Compression, Compressor

__all__ = ["DistributedGradientTape", "PartialDistributedGradientTape", "reduce_gradients"]


def _scales(op: int, predivide: float, process_set: ProcessSet) -> tuple[int, float, float]:
    """(op, prescale, postscale): Horovod splits an Average across the two scale factors
    when `gradient_predivide_factor` is set."""
    if predivide != 1.0:
        if op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        return Sum, 1.0 / predivide, predivide / len(process_set.ranks)
    return op, 1.0, 1.0


def _groups_of(indices: list[int], sources: list[Any], groups: Any) -> list[list[int]]:
    """Which gradients travel together: one fused group by default, `groups` equal-sized
    groups when an int, or the caller's lists of variables."""
    if not groups:
        return [indices]
    if isinstance(groups, int):
        if groups < 0:
            raise ValueError(f"groups must be a non-negative int or a list, got {groups}")
        size = max(1, -(-len(indices) // groups))
        return [indices[i : i + size] for i in range(0, len(indices), size)]
    position = {id(sources[i]): i for i in indices}
    chosen: list[list[int]] = []
    seen: set[int] = set()
    for group in groups:
        members = [position[id(v)] for v in group if id(v) in position]
        seen.update(members)
        if members:
            chosen.append(members)
    rest = [i for i in indices if i not in seen]
    return [*chosen, *[[i] for i in rest]]


def reduce_gradients(
    grads: Sequence[Any],
    sources: Sequence[Any],
    *,
    compression: type[Compressor] = Compression.none,
    sparse_as_dense: bool = False,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
    local_sources: frozenset[int] = frozenset(),
    scale_local_gradients: bool = True,
    postscale_factor: float = 1.0,
) -> list[Any]:
    """Horovod's gradient reduction (shared by the tape and Keras' DistributedOptimizer): None
    stays None, local sources are only scaled, the rest go in fused grouped allreduces."""
    if op == Adasum:
        raise NotImplementedError("Adasum is not implemented in hora.tensorflow")
    if op not in (Average, Sum):
        raise ValueError("op must be hvd.Average or hvd.Sum")
    op, prescale, postscale = _scales(op, gradient_predivide_factor, process_set)
    postscale *= postscale_factor
    grads = list(grads)
    size = len(process_set.ranks)
    local_scale = size if scale_local_gradients and size > 1 else 1
    reduce_these = _prepared(grads, sources, sparse_as_dense, local_sources, local_scale)
    if size == 1 and op == Average and prescale == postscale == 1.0:
        return grads
    for members in _groups_of(reduce_these, list(sources), groups):
        reduced = mpi_ops.grouped_allreduce(
            [grads[i] for i in members],
            compression=compression,
            op=op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=process_set,
        )
        for i, r in zip(members, reduced, strict=True):
            grads[i] = r
    return grads


def _prepared(
    grads: list[Any],
    sources: Sequence[Any],
    sparse_as_dense: bool,
    local_sources: frozenset[int],
    local_scale: int,
) -> list[int]:
    """Ready `grads` in place (IndexedSlices made dense if asked, the local sources' divided by
    `local_scale`); the indices of those to reduce."""
    reduce_these = []
    for i, g in enumerate(grads):
        if g is None:
            continue
        if sparse_as_dense and isinstance(g, tf.IndexedSlices):
            grads[i] = g = tf.convert_to_tensor(g)
        if id(sources[i]) in local_sources:
            if local_scale > 1:
                grads[i] = _divided(g, local_scale)
            continue
        reduce_these.append(i)
    return reduce_these


def _divided(grad: Any, size: int) -> Any:
    """A local gradient scaled down as Horovod scales it (an IndexedSlices' values)."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / size, grad.indices, grad.dense_shape)
    return grad / size


def local_variables(local_layers: Any) -> list[Any]:
    """The trainable variables of `local_layers` (a Keras layer or a list of them), Horovod's
    rule for what stays local in the Partial* tape and optimizer."""
    if local_layers is None:
        return []
    layers = [local_layers] if isinstance(local_layers, keras.layers.Layer) else local_layers
    if not all(isinstance(layer, keras.layers.Layer) for layer in layers):
        raise ValueError("All local layers must be of keras.layers.Layer type.")
    return [var for layer in layers for var in layer.trainable_weights]


class _DistributedGradientTape:
    """The methods a wrapped tape gains (copied into a subclass of the tape's own class)."""

    _hora: dict[str, Any]

    def register_local_source(self, source: Any) -> None:
        """A variable each rank keeps to itself: its gradient is not reduced (only scaled)."""
        self._hora["local"][id(source)] = source  # kept alive: its id stays its own

    def gradient(
        self, target: Any, sources: Any, output_gradients: Any = None, **kwargs: Any
    ) -> Any:
        grads = super(type(self), self).gradient(  # type: ignore[misc]
            target, sources, output_gradients, **kwargs
        )
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        options = self._hora
        reduced = reduce_gradients(
            flat_grads,
            flat_sources,
            compression=options["compression"],
            sparse_as_dense=options["sparse_as_dense"],
            op=options["op"],
            gradient_predivide_factor=options["gradient_predivide_factor"],
            groups=options["groups"],
            process_set=options["process_set"],
            local_sources=frozenset(options["local"]),
            scale_local_gradients=options["scale_local_gradients"],
        )
        return tf.nest.pack_sequence_as(sources, reduced)


def DistributedGradientTape(
    gradtape: tf.GradientTape,
    device_dense: str = "",
    device_sparse: str = "",
    compression: type[Compressor] = Compression.none,
    sparse_as_dense: bool = False,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
    scale_local_gradients: bool = True,
) -> tf.GradientTape:
    """Wrap `gradtape` (after its `with` block, or before) so that `gradient()` returns the
    gradients averaged (`op`) over the ranks of `process_set`.

    The result is an instance of a subclass of the tape's class sharing the tape's state, as
    Horovod builds it. `device_dense`/`device_sparse` are accepted and ignored.
    """
    del device_dense, device_sparse
    if num_groups and groups is None:
        groups = num_groups
    base = gradtape.__class__
    methods = {k: v for k, v in _DistributedGradientTape.__dict__.items() if not k.startswith("__")}
    methods.update(__module__=base.__module__, __qualname__=base.__qualname__)
    cls: Any = type(base.__name__, (base,), methods)  # a TF class, made here
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._hora = {
        "compression": compression,
        "sparse_as_dense": sparse_as_dense,
        "op": op,
        "gradient_predivide_factor": float(gradient_predivide_factor),
        "groups": groups,
        "process_set": process_set,
        "scale_local_gradients": scale_local_gradients,
        "local": {},
    }
    return tape


def PartialDistributedGradientTape(
    gradtape: tf.GradientTape,
    device_dense: str = "",
    device_sparse: str = "",
    compression: type[Compressor] = Compression.none,
    sparse_as_dense: bool = False,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
    local_layers: Any = None,
    scale_local_gradients: bool = True,
) -> tf.GradientTape:
    """A DistributedGradientTape whose `local_layers`' (a Keras layer or a list) variables stay
    local: their gradients are not reduced, only divided by the set size when
    `scale_local_gradients`."""
    tape = DistributedGradientTape(
        gradtape,
        device_dense,
        device_sparse,
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        num_groups,
        groups,
        process_set,
        scale_local_gradients,
    )
    for var in local_variables(local_layers):
        tape.register_local_source(var)
    return tape
