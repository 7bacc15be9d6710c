"""A Horovod user's test module for the TensorFlow 2 API, with only the import changed.

Written the way Horovod's own test/parallel/test_tensorflow.py is (a `tf.test.TestCase` whose
tests each call `hvd.init()`; every op over dtypes and dimensions; the error tests expect the
`tf.errors` class a Horovod op raises; gradients checked against Horovod's registered ones;
process sets added and removed; in-place broadcasts, rank ops, join, SyncBatchNormalization and
the gradient tapes), and run the way such suites run: one pytest session per rank, every test
one after another in the same process. Each test runs twice: its ops eagerly
(`TensorFlowEagerTests`) and traced into a `tf.function` (`TensorFlowFunctionTests`), so a graph
raises what eager code raises. The name keeps the outer pytest from collecting it.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import hora.tensorflow as hvd  # was: import horovod.tensorflow as hvd
from tests.tensorflow.horovod_session._timeline import recorded_tracks, shared_trace

DTYPES = [tf.int32, tf.int64, tf.float16, tf.float32, tf.float64]
GATHER_DTYPES = [tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.float32, tf.float64, tf.bool]
FLOATS = [tf.float32, tf.float64]
DIMS = [1, 2, 3]


def random_uniform(shape: list[int], dtype: tf.DType, low: int = -100, high: int = 100) -> Any:
    """The same values on every rank (a fixed seed), as Horovod's tests draw them."""
    values = np.random.default_rng(1234).uniform(low, high, size=shape)
    return tf.cast(tf.constant(values), dtype)


def tolerance(dtype: tf.DType) -> dict[str, float]:
    return {"rtol": 1e-2, "atol": 1e-1} if dtype == tf.float16 else {"rtol": 1e-6, "atol": 1e-6}


class _TensorFlowTests:
    """The tests; `run_ops(fn)` builds and runs `fn`'s ops, eagerly or as a tf.function."""

    assertAllClose: Callable[..., None]
    assertAllEqual: Callable[..., None]
    assertEqual: Callable[..., None]
    assertRaises: Callable[..., Any]
    assertTrue: Callable[..., None]
    skipTest: Callable[..., None]

    eager: bool

    def run_ops(self, fn: Callable[..., Any], *args: Any) -> Any:
        raise NotImplementedError

    def even_odd_sets(self) -> tuple[Any, Any, Any, list[int]]:
        rank, size = hvd.rank(), hvd.size()
        even_ranks = [rk for rk in range(size) if rk % 2 == 0]
        odd_ranks = [rk for rk in range(size) if rk % 2 == 1]
        even_set = hvd.add_process_set(even_ranks)
        odd_set = hvd.add_process_set(odd_ranks)
        if rank in even_ranks:
            return even_set, odd_set, even_set, even_ranks
        return even_set, odd_set, odd_set, odd_ranks

    def remove_sets(self, *sets: Any) -> None:
        for process_set in sets:
            hvd.remove_process_set(process_set)

    def need_two(self) -> None:
        if hvd.size() == 1:
            self.skipTest("Only one worker available")

    # ----- basics and the rank ops --------------------------------------------------------------
    def test_horovod_rank(self):
        hvd.init()
        self.assertEqual(hvd.rank(), int(os.environ["HOROVOD_RANK"]))

    def test_horovod_size(self):
        hvd.init()
        self.assertEqual(hvd.size(), int(os.environ["HOROVOD_SIZE"]))

    def test_horovod_rank_op(self):
        hvd.init()
        self.assertEqual(int(self.run_ops(hvd.rank_op)), hvd.rank())

    def test_horovod_local_rank_op(self):
        hvd.init()
        self.assertEqual(int(self.run_ops(hvd.local_rank_op)), hvd.local_rank())

    def test_horovod_size_op(self):
        hvd.init()
        self.assertEqual(int(self.run_ops(hvd.size_op)), hvd.size())

    def test_horovod_local_size_op(self):
        hvd.init()
        self.assertEqual(int(self.run_ops(hvd.local_size_op)), hvd.local_size())

    def test_horovod_size_op_process_set(self):
        hvd.init()
        even_set, odd_set, this_set, set_ranks = self.even_odd_sets()
        try:
            got = self.run_ops(lambda: hvd.size_op(process_set_id=this_set.process_set_id))
            self.assertEqual(int(got), len(set_ranks))
        finally:
            self.remove_sets(odd_set, even_set)

    def test_horovod_process_set_included_op(self):
        hvd.init()
        even_set, odd_set, this_set, _ = self.even_odd_sets()
        try:
            other = odd_set if this_set is even_set else even_set
            mine = self.run_ops(lambda: hvd.process_set_included_op(this_set.process_set_id))
            self.assertEqual(int(mine), 1)
            if other.ranks:
                theirs = self.run_ops(lambda: hvd.process_set_included_op(other.process_set_id))
                self.assertEqual(int(theirs), 0)
        finally:
            self.remove_sets(odd_set, even_set)

    def test_horovod_rank_op_uninitialized_error(self):
        """Horovod's ops check initialization when they run: FailedPreconditionError."""
        hvd.init()
        hvd.shutdown()
        try:
            with self.assertRaises(tf.errors.FailedPreconditionError):
                self.run_ops(hvd.rank_op)
            with self.assertRaises(tf.errors.FailedPreconditionError):
                self.run_ops(lambda: hvd.allreduce(tf.ones([2])))
        finally:
            hvd.init()

    def test_horovod_peer_shutdown_error(self):
        """A peer's shutdown stops this rank's op: UnknownError, as Horovod's TF ops raise
        (eagerly it is hora's HorovodInternalError too); shutdown() then init() start afresh."""
        hvd.init()
        self.need_two()
        size = hvd.size()
        try:
            if hvd.rank() == 0:
                with self.assertRaises(tf.errors.UnknownError) as caught:
                    self.run_ops(lambda: hvd.allreduce(tf.ones([1]), name="never"))
                if self.eager:
                    self.assertIsInstance(caught.exception, hvd.HorovodInternalError)
            else:
                time.sleep(0.2)
        finally:
            hvd.shutdown()
            hvd.init()
        self.assertAllClose(self.run_ops(lambda: hvd.allreduce(tf.ones([2]), op=hvd.Sum)),
                            [size, size])  # fmt: skip

    # ----- allreduce ----------------------------------------------------------------------------
    def test_horovod_allreduce_cpu(self):
        """Sum of 1D, 2D and 3D tensors of every dtype, all in one run (fused in a graph)."""
        hvd.init()
        size = hvd.size()
        cases = list(itertools.product(DTYPES, DIMS))
        tensors = [random_uniform([17] * dim, dtype) for dtype, dim in cases]
        summed = self.run_ops(lambda: [hvd.allreduce(t, op=hvd.Sum) for t in tensors])
        for (dtype, _), tensor, got in zip(cases, tensors, summed, strict=True):
            self.assertEqual(got.dtype, dtype)
            want = tf.cast(tensor, tf.float64) * size
            self.assertAllClose(tf.cast(got, tf.float64), want, **tolerance(dtype))

    def test_horovod_allreduce_average_cpu(self):
        hvd.init()
        cases = list(itertools.product(DTYPES, DIMS))
        tensors = [random_uniform([17] * dim, dtype) for dtype, dim in cases]
        averaged = self.run_ops(lambda: [hvd.allreduce(t, op=hvd.Average) for t in tensors])
        for (dtype, _), tensor, got in zip(cases, tensors, averaged, strict=True):
            self.assertAllClose(tf.cast(got, tf.float64), tf.cast(tensor, tf.float64),
                                **tolerance(dtype))  # fmt: skip

    def test_horovod_allreduce_min_max_product_cpu(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        base = random_uniform([5, 3], tf.float64, 1, 4)
        mine = base + rank
        mn, mx, prod = self.run_ops(
            lambda: [hvd.allreduce(mine, op=op) for op in (hvd.Min, hvd.Max, hvd.Product)]
        )
        self.assertAllClose(mn, base)
        self.assertAllClose(mx, base + size - 1)
        want = np.prod([base.numpy() + r for r in range(size)], axis=0)
        self.assertAllClose(prod, want)

    def test_horovod_allreduce_cpu_prescale(self):
        hvd.init()
        self._scaled_allreduce(0.5, prescale_factor=0.5)

    def test_horovod_allreduce_cpu_postscale(self):
        hvd.init()
        self._scaled_allreduce(1.5, postscale_factor=1.5)

    def _scaled_allreduce(self, factor: float, **scale: float) -> None:
        size = hvd.size()
        cases = itertools.product(FLOATS, DIMS)
        tensors = [random_uniform([17] * dim, dtype) for dtype, dim in cases]
        got = self.run_ops(lambda: [hvd.allreduce(t, op=hvd.Sum, **scale) for t in tensors])
        for tensor, summed in zip(tensors, got, strict=True):
            self.assertAllClose(summed, tensor * factor * size)

    def test_horovod_allreduce_error(self):
        """Ranks that disagree on the shape: FailedPreconditionError on every rank."""
        hvd.init()
        self.need_two()
        tensor_size = [17] * 3
        tensor_size[1] = 10 * (hvd.rank() + 1)
        tensor = tf.ones(tensor_size)
        with self.assertRaises(tf.errors.FailedPreconditionError):
            self.run_ops(lambda: hvd.allreduce(tensor))

    def test_horovod_allreduce_type_error(self):
        hvd.init()
        self.need_two()
        dtype = tf.int32 if hvd.rank() % 2 == 0 else tf.float32
        tensor = tf.ones([17] * 3, dtype=dtype)
        with self.assertRaises(tf.errors.FailedPreconditionError):
            self.run_ops(lambda: hvd.allreduce(tensor))

    def test_horovod_allreduce_op_error(self):
        hvd.init()
        self.need_two()
        op = hvd.Sum if hvd.rank() % 2 == 0 else hvd.Max
        with self.assertRaises(tf.errors.FailedPreconditionError):
            self.run_ops(lambda: hvd.allreduce(tf.ones([4]), op=op))

    def test_horovod_allreduce_after_errors(self):
        """A refused op leaves the engine working for the next one."""
        hvd.init()
        got = self.run_ops(lambda: hvd.allreduce(tf.ones([3]), op=hvd.Sum))
        self.assertAllClose(got, np.full(3, hvd.size()))

    def test_horovod_allreduce_adasum_error(self):
        hvd.init()
        with self.assertRaises(NotImplementedError):
            self.run_ops(lambda: hvd.allreduce(tf.ones([3]), op=hvd.Adasum))

    def test_horovod_allreduce_grad_cpu(self):
        """Horovod's gradient of a Sum allreduce is a Sum allreduce of the gradient."""
        hvd.init()
        self._allreduce_grad(hvd.Sum, hvd.size())

    def test_horovod_allreduce_average_grad_cpu(self):
        hvd.init()
        self._allreduce_grad(hvd.Average, 1)

    def _allreduce_grad(self, op: int, factor: int, **kwargs: Any) -> None:
        cases = list(itertools.product(FLOATS, DIMS))

        def grads() -> list[tf.Tensor]:
            out = []
            for dtype, dim in cases:
                x = random_uniform([5] * dim, dtype)
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    y = hvd.allreduce(x, op=op, **kwargs)
                out.append(tape.gradient(y, x, tf.ones([5] * dim, dtype)))
            return out

        for (_, dim), grad in zip(cases, self.run_ops(grads), strict=True):
            self.assertAllClose(grad, np.full([5] * dim, float(factor)))

    def test_horovod_allreduce_grad_prescale_postscale_cpu(self):
        """The gradient carries the op's scale factors (the same op runs on the gradient)."""
        hvd.init()
        self._allreduce_grad(hvd.Sum, hvd.size() * 0.5 * 3.0, prescale_factor=0.5,
                             postscale_factor=3.0)  # fmt: skip

    def test_horovod_grouped_allreduce_cpu(self):
        hvd.init()
        size = hvd.size()
        for dtype, dim in itertools.product(DTYPES, DIMS):
            tensors = [random_uniform([17] * dim, dtype) * (k + 1) for k in range(5)]
            summed = self.run_ops(lambda ts=tensors: hvd.grouped_allreduce(ts, op=hvd.Sum))
            for tensor, got in zip(tensors, summed, strict=True):
                self.assertAllClose(tf.cast(got, tf.float64), tf.cast(tensor, tf.float64) * size,
                                    **tolerance(dtype))  # fmt: skip

    def test_horovod_grouped_allreduce_grad_cpu(self):
        hvd.init()
        size = hvd.size()

        def grads() -> list[tf.Tensor]:
            xs = [random_uniform([5, 3], tf.float32) for _ in range(4)]
            with tf.GradientTape() as tape:
                tape.watch(xs)
                ys = hvd.grouped_allreduce(xs, op=hvd.Sum)
            return tape.gradient(ys, xs, [tf.ones([5, 3])] * 4)

        for grad in self.run_ops(grads):
            self.assertAllClose(grad, np.full([5, 3], float(size)))

    def test_horovod_allreduce_process_sets(self):
        hvd.init()
        rank = hvd.rank()
        even_set, odd_set, this_set, set_ranks = self.even_odd_sets()
        try:
            tensors = [random_uniform([17] * dim, tf.float32) for dim in DIMS]
            summed = self.run_ops(
                lambda: [hvd.allreduce(t * (rank + 1), op=hvd.Sum, process_set=this_set)
                         for t in tensors]
            )  # fmt: skip
            factor = sum(r + 1 for r in set_ranks)
            for tensor, got in zip(tensors, summed, strict=True):
                self.assertAllClose(got, tensor * factor, rtol=1e-5)
        finally:
            self.remove_sets(odd_set, even_set)

    def test_horovod_allreduce_grad_process_sets(self):
        hvd.init()
        even_set, odd_set, this_set, set_ranks = self.even_odd_sets()
        try:

            def grad() -> tf.Tensor:
                x = tf.ones([4, 2])
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    y = hvd.allreduce(x, op=hvd.Sum, process_set=this_set)
                return tape.gradient(y, x)

            self.assertAllClose(self.run_ops(grad), np.full([4, 2], float(len(set_ranks))))
        finally:
            self.remove_sets(odd_set, even_set)

    def test_horovod_allreduce_not_member_error(self):
        """An op on a set this rank is not in: InvalidArgumentError, as Horovod's op says."""
        hvd.init()
        self.need_two()
        first = hvd.add_process_set([0])
        try:
            if hvd.rank() != 0:
                with self.assertRaises(tf.errors.InvalidArgumentError):
                    self.run_ops(lambda: hvd.allreduce(tf.ones([2]), process_set=first))
        finally:
            self.remove_sets(first)

    # ----- IndexedSlices ------------------------------------------------------------------------
    def _slices(self) -> tf.IndexedSlices:
        rank, size = hvd.rank(), hvd.size()
        values = tf.fill([2, 3], float(rank + 1))
        return tf.IndexedSlices(values, tf.constant([rank, rank + 1]), tf.constant([size + 1, 3]))

    def test_horovod_allreduce_indexed_slices_average(self):
        """IndexedSlices are gathered (values and indices); Average divides by the set size."""
        hvd.init()
        size = hvd.size()
        got = self.run_ops(lambda: hvd.allreduce(self._slices()))
        self.assertTrue(isinstance(got, tf.IndexedSlices))
        want = np.repeat(np.arange(1, size + 1, dtype=np.float32), 2)[:, None] / size
        self.assertAllClose(got.values, np.repeat(want, 3, axis=1))
        self.assertAllEqual(got.indices, [i for r in range(size) for i in (r, r + 1)])
        self.assertAllClose(tf.convert_to_tensor(got)[0], np.full(3, 1 / size))

    def test_horovod_allreduce_indexed_slices_sum(self):
        hvd.init()
        size = hvd.size()
        got = self.run_ops(lambda: hvd.allreduce(self._slices(), op=hvd.Sum))
        dense = tf.convert_to_tensor(got).numpy()
        want = np.zeros([size + 1, 3])
        for r in range(size):
            want[r : r + 2] += r + 1
        self.assertAllClose(dense, want)

    def test_horovod_allreduce_indexed_slices_errors(self):
        """Horovod refuses Adasum and scale factors on IndexedSlices (NotImplementedError);
        hora also refuses Min, Max and Product, which gathering would turn into a Sum."""
        hvd.init()
        for kwargs in ({"op": hvd.Adasum}, {"prescale_factor": 2.0}, {"postscale_factor": 0.5},
                       {"op": hvd.Max}):  # fmt: skip
            with self.assertRaises(NotImplementedError):
                self.run_ops(lambda k=kwargs: hvd.allreduce(self._slices(), **k))

    # ----- allgather ----------------------------------------------------------------------------
    def test_horovod_allgather_cpu(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        cases = list(itertools.product(GATHER_DTYPES, DIMS))
        tensors = [tf.cast(tf.ones([17] * dim) * (rank % 2 if dt == tf.bool else rank), dt)
                   for dt, dim in cases]  # fmt: skip
        gathered = self.run_ops(lambda: [hvd.allgather(t) for t in tensors])
        for (dtype, dim), got in zip(cases, gathered, strict=True):
            self.assertEqual(got.dtype, dtype)
            self.assertEqual(list(got.shape), [17 * size] + [17] * (dim - 1))
            for r in range(size):
                block = tf.cast(got[r * 17 : (r + 1) * 17], tf.int32)
                self.assertAllEqual(block, np.full([17] * dim, r % 2 if dtype == tf.bool else r))

    def test_horovod_allgather_variable_size_cpu(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        sizes = ([17, 32, 81, 12, 15, 23, 22] * 5)[:size]
        cases = list(itertools.product(DTYPES, DIMS))
        tensors = [
            tf.cast(tf.ones([sizes[rank]] + [17] * (dim - 1)) * rank, dt) for dt, dim in cases
        ]
        gathered = self.run_ops(lambda: [hvd.allgather(t) for t in tensors])
        for (_, dim), got in zip(cases, gathered, strict=True):
            self.assertEqual(list(got.shape), [sum(sizes)] + [17] * (dim - 1))
            start = 0
            for r, n in enumerate(sizes):
                self.assertAllEqual(tf.cast(got[start : start + n], tf.int32),
                                    np.full([n] + [17] * (dim - 1), r))  # fmt: skip
                start += n

    def test_horovod_allgather_error(self):
        """Ranks that disagree on a dimension other than the first: FailedPreconditionError."""
        hvd.init()
        self.need_two()
        tensor_size = [17] * 3
        tensor_size[1] = 10 * (hvd.rank() + 1)
        tensor = tf.ones(tensor_size) * hvd.rank()
        with self.assertRaises(tf.errors.FailedPreconditionError):
            self.run_ops(lambda: hvd.allgather(tensor))

    def test_horovod_allgather_type_error(self):
        hvd.init()
        self.need_two()
        dtype = tf.int32 if hvd.rank() % 2 == 0 else tf.float32
        tensor = tf.ones([17] * 3, dtype=dtype)
        with self.assertRaises(tf.errors.FailedPreconditionError):
            self.run_ops(lambda: hvd.allgather(tensor))

    def test_horovod_allgather_scalar_error(self):
        hvd.init()
        with self.assertRaises(ValueError):
            self.run_ops(lambda: hvd.allgather(tf.constant(1.0)))

    def test_horovod_allgather_grad_cpu(self):
        """Horovod's allgather gradient: an Average allreduce, this rank's rows."""
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        sizes = ([3, 2, 7, 4, 6, 8, 10] * 5)[:size]
        cases = list(itertools.product(FLOATS, DIMS))

        def grads() -> list[tf.Tensor]:
            out = []
            for dtype, dim in cases:
                x = tf.ones([sizes[rank]] + [17] * (dim - 1), dtype) * rank
                grad_ys = tf.concat(
                    [tf.ones([n] + [17] * (dim - 1), dtype) * r for r, n in enumerate(sizes)], 0
                )
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    gathered = hvd.allgather(x)
                out.append(tape.gradient(gathered, x, grad_ys))
            return out

        for (_, dim), grad in zip(cases, self.run_ops(grads), strict=True):
            self.assertAllClose(grad, np.full([sizes[rank]] + [17] * (dim - 1), float(rank)))

    def test_horovod_grouped_allgather_cpu(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        tensors = [tf.ones([rank + 1, 17]) * rank, tf.ones([2, 3], tf.int64) * rank]
        a, b = self.run_ops(lambda: hvd.grouped_allgather(tensors))
        self.assertAllEqual(a[:, 0], [r for r in range(size) for _ in range(r + 1)])
        self.assertAllEqual(b[:, 0], [r for r in range(size) for _ in range(2)])

    def test_horovod_grouped_allgather_grad_cpu(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()

        def grads() -> list[tf.Tensor]:
            xs = [tf.ones([rank + 1, 3]), tf.ones([2, 2])]
            ys = [tf.concat([tf.ones([r + 1, 3]) * r for r in range(size)], 0),
                  tf.concat([tf.ones([2, 2]) * r for r in range(size)], 0)]  # fmt: skip
            with tf.GradientTape() as tape:
                tape.watch(xs)
                gathered = hvd.grouped_allgather(xs)
            return tape.gradient(gathered, xs, ys)

        ga, gb = self.run_ops(grads)
        self.assertAllClose(ga, np.full([rank + 1, 3], float(rank)))
        self.assertAllClose(gb, np.full([2, 2], float(rank)))

    def test_horovod_allgather_process_sets(self):
        hvd.init()
        rank = hvd.rank()
        even_set, odd_set, this_set, set_ranks = self.even_odd_sets()
        try:
            tensors = [tf.ones([17] * dim) * rank for dim in DIMS]
            gathered = self.run_ops(
                lambda: [hvd.allgather(t, process_set=this_set) for t in tensors]
            )
            for dim, got in zip(DIMS, gathered, strict=True):
                self.assertEqual(list(got.shape), [17 * len(set_ranks)] + [17] * (dim - 1))
                for i, r in enumerate(set_ranks):
                    self.assertAllEqual(got[i * 17 : (i + 1) * 17], np.full([17] * dim, r))
        finally:
            self.remove_sets(odd_set, even_set)

    def test_horovod_allgather_grad_process_sets(self):
        hvd.init()
        rank = hvd.rank()
        even_set, odd_set, this_set, set_ranks = self.even_odd_sets()
        try:

            def grad() -> tf.Tensor:
                x = tf.ones([rank + 1, 2])
                ys = tf.concat([tf.ones([r + 1, 2]) * r for r in set_ranks], 0)
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    gathered = hvd.allgather(x, process_set=this_set)
                return tape.gradient(gathered, x, ys)

            self.assertAllClose(self.run_ops(grad), np.full([rank + 1, 2], float(rank)))
        finally:
            self.remove_sets(odd_set, even_set)

    # ----- broadcast ----------------------------------------------------------------------------
    def test_horovod_broadcast_cpu(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        cases = list(itertools.product(GATHER_DTYPES, DIMS, range(size)))

        def broadcast_all() -> list[tf.Tensor]:
            out = []
            for dtype, dim, root in cases:
                value = rank % 2 if dtype == tf.bool else rank
                out.append(hvd.broadcast(tf.cast(tf.ones([17] * dim) * value, dtype), root))
            return out

        for (dtype, dim, root), got in zip(cases, self.run_ops(broadcast_all), strict=True):
            want = root % 2 if dtype == tf.bool else root
            self.assertAllEqual(tf.cast(got, tf.int32), np.full([17] * dim, want))

    def test_horovod_broadcast_error(self):
        hvd.init()
        self.need_two()
        tensor_size = [17] * 3
        tensor_size[1] = 10 * (hvd.rank() + 1)
        tensor = tf.ones(tensor_size) * hvd.rank()
        with self.assertRaises(tf.errors.FailedPreconditionError):
            self.run_ops(lambda: hvd.broadcast(tensor, 0))

    def test_horovod_broadcast_type_error(self):
        hvd.init()
        self.need_two()
        dtype = tf.int32 if hvd.rank() % 2 == 0 else tf.float32
        tensor = tf.ones([17] * 3, dtype=dtype)
        with self.assertRaises(tf.errors.FailedPreconditionError):
            self.run_ops(lambda: hvd.broadcast(tensor, 0))

    def test_horovod_broadcast_rank_error(self):
        """Ranks that disagree on the root: FailedPreconditionError."""
        hvd.init()
        self.need_two()
        tensor = tf.ones([17] * 3) * hvd.rank()
        with self.assertRaises(tf.errors.FailedPreconditionError):
            self.run_ops(lambda: hvd.broadcast(tensor, hvd.rank()))

    def test_horovod_broadcast_root_out_of_range_error(self):
        hvd.init()
        with self.assertRaises(tf.errors.InvalidArgumentError):
            self.run_ops(lambda: hvd.broadcast(tf.ones([3]), hvd.size()))

    def test_horovod_broadcast_grad_cpu(self):
        """Horovod's broadcast gradient: an Average allreduce on the root, zero elsewhere."""
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        cases = list(itertools.product(FLOATS, DIMS, range(size)))

        def grads() -> list[tf.Tensor]:
            out = []
            for dtype, dim, root in cases:
                x = tf.ones([5] * dim, dtype) * rank
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    y = hvd.broadcast(x, root)
                out.append(tape.gradient(y, x, tf.ones([5] * dim, dtype)))
            return out

        for (_, dim, root), grad in zip(cases, self.run_ops(grads), strict=True):
            self.assertAllClose(grad, np.full([5] * dim, 1.0 if rank == root else 0.0))

    def test_horovod_broadcast_inplace_cpu(self):
        """`broadcast_` assigns the root's values to the variables and returns them."""
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        for dtype, root in itertools.product(GATHER_DTYPES, range(size)):
            value = rank % 2 if dtype == tf.bool else rank
            var = tf.Variable(tf.cast(tf.ones([17, 3]) * value, dtype))
            got = self.run_ops(lambda v=var, rt=root: hvd.broadcast_(v, rt))
            want = np.full([17, 3], root % 2 if dtype == tf.bool else root)
            self.assertAllEqual(tf.cast(got, tf.int32), want)
            self.assertAllEqual(tf.cast(var, tf.int32), want)

    def test_horovod_broadcast_inplace_multiple_cpu(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        variables = [tf.Variable(tf.ones([k + 1, 2]) * rank) for k in range(4)]
        variables.append(keras.Variable(np.full([3], rank, dtype="int64")))
        got = self.run_ops(lambda: hvd.broadcast_(variables, size - 1))
        self.assertEqual(len(got), len(variables))
        for var, value in zip(variables, got, strict=True):
            self.assertAllEqual(tf.cast(value, tf.int32), np.full(value.shape, size - 1))
            self.assertAllEqual(tf.cast(tf.convert_to_tensor(var), tf.int32),
                                np.full(value.shape, size - 1))  # fmt: skip

    def test_horovod_broadcast_process_sets(self):
        hvd.init()
        rank = hvd.rank()
        even_set, odd_set, this_set, set_ranks = self.even_odd_sets()
        try:
            tensor = tf.ones([17, 2]) * rank
            got = self.run_ops(
                lambda: [hvd.broadcast(tensor, root, process_set=this_set) for root in set_ranks]
            )
            for root, value in zip(set_ranks, got, strict=True):
                self.assertAllEqual(value, np.full([17, 2], root))
        finally:
            self.remove_sets(odd_set, even_set)

    def test_horovod_broadcast_grad_process_sets(self):
        hvd.init()
        rank = hvd.rank()
        even_set, odd_set, this_set, set_ranks = self.even_odd_sets()
        try:
            for root in set_ranks:

                def grad(root: int = root) -> tf.Tensor:
                    x = tf.ones([3, 2]) * rank
                    with tf.GradientTape() as tape:
                        tape.watch(x)
                        y = hvd.broadcast(x, root, process_set=this_set)
                    return tape.gradient(y, x)

                want = np.full([3, 2], 1.0 if rank == root else 0.0)
                self.assertAllClose(self.run_ops(grad), want)
        finally:
            self.remove_sets(odd_set, even_set)

    # ----- alltoall -----------------------------------------------------------------------------
    def _alltoall_input(self, dtype: tf.DType, dim: int) -> tf.Tensor:
        rank, size = hvd.rank(), hvd.size()
        vals = [i for i in range(size) for _ in range(rank + 1)]
        tensor = tf.convert_to_tensor(vals, dtype=dtype)
        for _ in range(dim - 1):
            tensor = tf.expand_dims(tensor, axis=1)
            tensor = tf.concat([tensor, tensor], axis=1)
        return tensor

    def test_horovod_alltoall_cpu(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        cases = list(itertools.product(DTYPES, DIMS))
        tensors = [self._alltoall_input(dtype, dim) for dtype, dim in cases]
        splits = tf.convert_to_tensor([rank + 1] * size, dtype=tf.int32)
        outs = self.run_ops(lambda: [hvd.alltoall(t, splits) for t in tensors])
        for (_, dim), (collected, received) in zip(cases, outs, strict=True):
            self.assertAllEqual(tf.reduce_min(collected), rank)
            self.assertAllEqual(tf.reduce_max(collected), rank)
            self.assertEqual(int(tf.size(collected)), size * (size + 1) // 2 * 2 ** (dim - 1))
            self.assertAllEqual(received, [r + 1 for r in range(size)])

    def test_horovod_alltoall_equal_split_cpu(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        cases = list(itertools.product(DTYPES, DIMS))
        tensors = [self._alltoall_input(dtype, dim) for dtype, dim in cases]
        outs = self.run_ops(lambda: [hvd.alltoall(t) for t in tensors])
        for (_, dim), collected in zip(cases, outs, strict=True):
            self.assertAllEqual(tf.reduce_min(collected), rank)
            self.assertAllEqual(tf.reduce_max(collected), rank)
            self.assertEqual(int(tf.size(collected)), size * (size + 1) // 2 * 2 ** (dim - 1))

    def test_horovod_alltoall_empty_cpu(self):
        hvd.init()
        size = hvd.size()
        for dtype in DTYPES:
            got = self.run_ops(lambda d=dtype: hvd.alltoall(tf.zeros([size, 0], d)))
            self.assertEqual(list(got.shape), [size, 0])

    def test_horovod_alltoall_one_rank_sends_nothing_cpu(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        self.need_two()
        splits = [0] * size if rank == 0 else [rank + 1] * size
        tensor = tf.fill([sum(splits), 2], float(rank))
        collected, received = self.run_ops(
            lambda: hvd.alltoall(tensor, tf.constant(splits, dtype=tf.int32))
        )
        self.assertAllEqual(received, [0] + [r + 1 for r in range(1, size)])
        self.assertEqual(int(tf.shape(collected)[0]), sum(r + 1 for r in range(1, size)))

    def test_horovod_alltoall_one_rank_receives_nothing_cpu(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        self.need_two()
        splits = [0] + [rank + 1] * (size - 1)
        tensor = tf.fill([sum(splits), 2], float(rank))
        collected, received = self.run_ops(
            lambda: hvd.alltoall(tensor, tf.constant(splits, dtype=tf.int32))
        )
        if rank == 0:
            self.assertEqual(int(tf.size(collected)), 0)
            self.assertAllEqual(received, [0] * size)
        else:
            self.assertAllEqual(received, [r + 1 for r in range(size)])
            self.assertAllEqual(collected[:, 0], [r for r in range(size) for _ in range(r + 1)])

    def test_horovod_alltoall_zero_splits_cpu(self):
        hvd.init()
        size = hvd.size()
        tensor = tf.ones([size, 3])
        collected, received = self.run_ops(
            lambda: hvd.alltoall(tensor, tf.zeros([size], dtype=tf.int32))
        )
        self.assertEqual(list(collected.shape), [0, 3])
        self.assertAllEqual(received, [0] * size)

    def test_horovod_alltoall_equal_split_length_error(self):
        """A dim 0 the set size does not divide, with no splits: InvalidArgumentError."""
        hvd.init()
        self.need_two()
        tensor = tf.ones([hvd.size() + 1])
        with self.assertRaises(tf.errors.InvalidArgumentError):
            self.run_ops(lambda: hvd.alltoall(tensor))

    def test_horovod_alltoall_splits_error(self):
        """Splits whose sum exceeds dim 0: InvalidArgumentError."""
        hvd.init()
        self.need_two()
        size = hvd.size()
        tensor = tf.ones([size - 1])
        with self.assertRaises(tf.errors.InvalidArgumentError):
            self.run_ops(lambda: hvd.alltoall(tensor, tf.ones([size], dtype=tf.int32)))

    def test_horovod_alltoall_splits_length_error(self):
        hvd.init()
        self.need_two()
        tensor = tf.ones([4])
        with self.assertRaises(tf.errors.InvalidArgumentError):
            self.run_ops(lambda: hvd.alltoall(tensor, tf.ones([hvd.size() + 1], tf.int32)))

    def test_horovod_alltoall_rank_error(self):
        """Ranks that disagree on a dimension other than the first: FailedPreconditionError."""
        hvd.init()
        self.need_two()
        size = hvd.size()
        tensor_size = [2 * size] * 3
        tensor_size[1] = 10 * (hvd.rank() + 1)
        tensor = tf.ones(tensor_size)
        with self.assertRaises(tf.errors.FailedPreconditionError):
            self.run_ops(lambda: hvd.alltoall(tensor))

    def test_horovod_alltoall_type_error(self):
        hvd.init()
        self.need_two()
        dtype = tf.int32 if hvd.rank() % 2 == 0 else tf.float32
        tensor = tf.ones([hvd.size() * 2], dtype=dtype)
        with self.assertRaises(tf.errors.FailedPreconditionError):
            self.run_ops(lambda: hvd.alltoall(tensor))

    def test_horovod_alltoall_grad_cpu(self):
        """Horovod's alltoall gradient: the gradient goes back by the received splits."""
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        cases = list(itertools.product(FLOATS, DIMS))

        def grads() -> list[tf.Tensor]:
            out = []
            for dtype, dim in cases:
                x = self._alltoall_input(dtype, dim)
                splits = tf.convert_to_tensor([rank + 1] * size, dtype=tf.int32)
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    collected, _ = hvd.alltoall(x, splits)
                out.append(tape.gradient(collected, x, tf.ones_like(collected) * (rank + 1)))
            return out

        for (dtype, dim), grad in zip(cases, self.run_ops(grads), strict=True):
            shape = self._alltoall_input(dtype, dim).shape
            want = np.repeat(np.arange(1, size + 1, dtype=float), rank + 1)
            want = want.reshape([-1] + [1] * (dim - 1)) * np.ones(shape)
            self.assertAllClose(grad, want)

    def test_horovod_alltoall_equal_split_grad_cpu(self):
        hvd.init()

        def grad() -> tf.Tensor:
            x = tf.ones([2 * hvd.size(), 3])
            with tf.GradientTape() as tape:
                tape.watch(x)
                collected = hvd.alltoall(x)
            return tape.gradient(collected, x)

        self.assertAllClose(self.run_ops(grad), np.ones([2 * hvd.size(), 3]))

    def test_horovod_alltoall_grad_rows_not_sent(self):
        """Rows beyond the splits' sum are not sent: their gradient is zero."""
        hvd.init()
        size = hvd.size()

        def grad() -> tf.Tensor:
            x = tf.ones([size + 2, 2])
            with tf.GradientTape() as tape:
                tape.watch(x)
                collected, _ = hvd.alltoall(x, tf.ones([size], tf.int32))
            return tape.gradient(collected, x)

        self.assertAllClose(self.run_ops(grad), np.concatenate([np.ones([size, 2]),
                                                                np.zeros([2, 2])]))  # fmt: skip

    def test_horovod_alltoall_process_sets(self):
        hvd.init()
        rank = hvd.rank()
        even_set, odd_set, this_set, set_ranks = self.even_odd_sets()
        try:
            n = len(set_ranks)
            tensor = tf.fill([2 * n, 3], float(rank))
            got = self.run_ops(lambda: hvd.alltoall(tensor, process_set=this_set))
            self.assertAllEqual(got[:, 0], [r for r in set_ranks for _ in range(2)])
        finally:
            self.remove_sets(odd_set, even_set)

    def test_horovod_alltoall_grad_process_sets(self):
        hvd.init()
        rank = hvd.rank()
        even_set, odd_set, this_set, set_ranks = self.even_odd_sets()
        try:
            n = len(set_ranks)

            def grad() -> tf.Tensor:
                x = tf.ones([2 * n, 3])
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    collected = hvd.alltoall(x, process_set=this_set)
                return tape.gradient(collected, x, tf.ones([2 * n, 3]) * (rank + 1))

            want = np.repeat([r + 1.0 for r in set_ranks], 2)[:, None] * np.ones([2 * n, 3])
            self.assertAllClose(self.run_ops(grad), want)
        finally:
            self.remove_sets(odd_set, even_set)

    # ----- reducescatter ------------------------------------------------------------------------
    def test_horovod_reducescatter_cpu(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        cases = list(itertools.product(DTYPES, DIMS))
        tensors = [random_uniform([size * 4] * dim, dtype) for dtype, dim in cases]
        outs = self.run_ops(lambda: [hvd.reducescatter(t, op=hvd.Sum) for t in tensors])
        for (dtype, _), tensor, got in zip(cases, tensors, outs, strict=True):
            want = tf.cast(tensor[rank * 4 : (rank + 1) * 4], tf.float64) * size
            self.assertAllClose(tf.cast(got, tf.float64), want, **tolerance(dtype))

    def test_horovod_reducescatter_average_cpu(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        tensors = [
            random_uniform([size * 4] * dim, dtype)
            for dtype, dim in itertools.product(FLOATS, DIMS)
        ]
        outs = self.run_ops(lambda: [hvd.reducescatter(t, op=hvd.Average) for t in tensors])
        for tensor, got in zip(tensors, outs, strict=True):
            self.assertAllClose(got, tensor[rank * 4 : (rank + 1) * 4])

    def test_horovod_reducescatter_cpu_uneven(self):
        """A dim 0 the set size does not divide: the first ranks get one row more."""
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        tensor = random_uniform([13, 2], tf.float32)
        got = self.run_ops(lambda: hvd.reducescatter(tensor, op=hvd.Sum))
        base, extra = divmod(13, size)
        start = rank * base + min(rank, extra)
        rows = base + (1 if rank < extra else 0)
        self.assertAllClose(got, tensor[start : start + rows] * size, rtol=1e-5)

    def test_horovod_reducescatter_cpu_prescale_postscale(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        tensor = random_uniform([size * 4, 3], tf.float64)
        got = self.run_ops(lambda: hvd.reducescatter(tensor, op=hvd.Sum, prescale_factor=0.5,
                                                     postscale_factor=3.0))  # fmt: skip
        self.assertAllClose(got, tensor[rank * 4 : (rank + 1) * 4] * size * 1.5)

    def test_horovod_reducescatter_error(self):
        hvd.init()
        self.need_two()
        tensor_size = [hvd.size() * 4] * 3
        tensor_size[1] = 10 * (hvd.rank() + 1)
        tensor = tf.ones(tensor_size)
        with self.assertRaises(tf.errors.FailedPreconditionError):
            self.run_ops(lambda: hvd.reducescatter(tensor))

    def test_horovod_reducescatter_type_error(self):
        hvd.init()
        self.need_two()
        dtype = tf.int32 if hvd.rank() % 2 == 0 else tf.float32
        tensor = tf.ones([hvd.size() * 4] * 3, dtype=dtype)
        with self.assertRaises(tf.errors.FailedPreconditionError):
            self.run_ops(lambda: hvd.reducescatter(tensor))

    def test_horovod_reducescatter_scalar_error(self):
        hvd.init()
        with self.assertRaises(ValueError):
            self.run_ops(lambda: hvd.reducescatter(tf.constant(1.0)))

    def test_horovod_reducescatter_grad_cpu(self):
        """Horovod's reducescatter gradient: an allgather, times the set size for Sum."""
        hvd.init()
        self._reducescatter_grad(hvd.Sum, hvd.size())

    def test_horovod_reducescatter_average_grad_cpu(self):
        hvd.init()
        self._reducescatter_grad(hvd.Average, 1)

    def test_horovod_reducescatter_grad_prescale_postscale_cpu(self):
        """The gradient carries the scale factors too."""
        hvd.init()
        self._reducescatter_grad(hvd.Sum, hvd.size() * 0.5 * 3.0, prescale_factor=0.5,
                                 postscale_factor=3.0)  # fmt: skip

    def _reducescatter_grad(self, op: int, factor: float, **kwargs: Any) -> None:
        size = hvd.size()
        cases = list(itertools.product(FLOATS, DIMS))

        def grads() -> list[tf.Tensor]:
            out = []
            for dtype, dim in cases:
                x = random_uniform([size * 4] * dim, dtype)
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    y = hvd.reducescatter(x, op=op, **kwargs)
                out.append(tape.gradient(y, x, tf.ones([4] + [size * 4] * (dim - 1), dtype)))
            return out

        for (_, dim), grad in zip(cases, self.run_ops(grads), strict=True):
            self.assertAllClose(grad, np.full([size * 4] * dim, float(factor)))

    def test_horovod_grouped_reducescatter_cpu(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        tensors = [random_uniform([size * 4, 3], tf.float32) * (k + 1) for k in range(3)]
        outs = self.run_ops(lambda: hvd.grouped_reducescatter(tensors, op=hvd.Sum))
        for tensor, got in zip(tensors, outs, strict=True):
            self.assertAllClose(got, tensor[rank * 4 : (rank + 1) * 4] * size, rtol=1e-5)

    def test_horovod_grouped_reducescatter_grad_cpu(self):
        hvd.init()
        size = hvd.size()

        def grads() -> list[tf.Tensor]:
            xs = [tf.ones([size * 2, 3]), tf.ones([size, 2])]
            with tf.GradientTape() as tape:
                tape.watch(xs)
                ys = hvd.grouped_reducescatter(xs, op=hvd.Sum)
            return tape.gradient(ys, xs)

        ga, gb = self.run_ops(grads)
        self.assertAllClose(ga, np.full([size * 2, 3], float(size)))
        self.assertAllClose(gb, np.full([size, 2], float(size)))

    def test_horovod_reducescatter_process_sets(self):
        hvd.init()
        even_set, odd_set, this_set, set_ranks = self.even_odd_sets()
        try:
            n, me = len(set_ranks), set_ranks.index(hvd.rank())
            tensor = random_uniform([n * 4, 2], tf.float32)
            got = self.run_ops(lambda: hvd.reducescatter(tensor, op=hvd.Sum, process_set=this_set))
            self.assertAllClose(got, tensor[me * 4 : (me + 1) * 4] * n, rtol=1e-5)
        finally:
            self.remove_sets(odd_set, even_set)

    def test_horovod_reducescatter_grad_process_sets(self):
        hvd.init()
        even_set, odd_set, this_set, set_ranks = self.even_odd_sets()
        try:
            n = len(set_ranks)

            def grad() -> tf.Tensor:
                x = tf.ones([n * 2, 3])
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    y = hvd.reducescatter(x, op=hvd.Sum, process_set=this_set)
                return tape.gradient(y, x)

            self.assertAllClose(self.run_ops(grad), np.full([n * 2, 3], float(n)))
        finally:
            self.remove_sets(odd_set, even_set)

    # ----- join, objects, compression -----------------------------------------------------------
    def test_horovod_join_allreduce(self):
        """A rank that joined adds zeros to the others' allreduces; join returns the last."""
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        self.need_two()
        for first in range(size):
            tensor = random_uniform([17, 2], tf.float32)
            if rank == first:
                last = self.run_ops(hvd.join)
            else:
                summed = self.run_ops(
                    lambda t=tensor, f=first: hvd.allreduce(t, op=hvd.Sum, name=f"join.{f}")
                )
                self.assertAllClose(summed, tensor * (size - 1), rtol=1e-5)
                last = self.run_ops(hvd.join)
            self.assertTrue(0 <= int(last) < size)

    def test_horovod_broadcast_object(self):
        hvd.init()
        expected = {"hello": 123, 0: [1, 2]}
        obj = expected if hvd.rank() == 0 else {}
        self.assertEqual(hvd.broadcast_object(obj, root_rank=0), expected)

    def test_horovod_allgather_object(self):
        hvd.init()
        got = hvd.allgather_object({"rank": hvd.rank()})
        self.assertEqual(got, [{"rank": r} for r in range(hvd.size())])

    def test_horovod_broadcast_variables(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        variables = [tf.Variable(tf.ones([3]) * rank), tf.Variable(rank, dtype=tf.int64)]
        hvd.broadcast_variables(variables, root_rank=size - 1)
        self.assertAllEqual(variables[0], np.full(3, float(size - 1)))
        self.assertEqual(int(variables[1]), size - 1)

    def test_horovod_allreduce_fp16_compression(self):
        hvd.init()
        size = hvd.size()
        tensor = random_uniform([17, 3], tf.float32)
        got = self.run_ops(
            lambda: hvd.allreduce(tensor, op=hvd.Sum, compression=hvd.Compression.fp16)
        )
        self.assertEqual(got.dtype, tf.float32)
        self.assertAllClose(got, tensor * size, rtol=1e-2, atol=1e-1)

    def test_horovod_timeline(self):
        """The timeline records the TF collectives of every rank, eager and traced alike
        (HOROVOD_TIMELINE=DYNAMIC is set for the job)."""
        hvd.init()
        name = f"timeline.probe.{type(self).__name__}"
        with shared_trace() as path:
            hvd.start_timeline(path)
            self.run_ops(lambda: hvd.allgather(tf.ones([1, 3]), name=name))
            hvd.stop_timeline()
            wanted = {(r, f"allgather.{name}") for r in range(hvd.size())}
            self.assertLessEqual(wanted, recorded_tracks(path, wanted))

    # ----- gradient tapes -----------------------------------------------------------------------
    def test_distributed_gradient_tape(self):
        """The tape's gradients are averaged over the ranks."""
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        w = tf.Variable([1.0, 2.0])

        def grad() -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(w * float(rank + 1))
            return hvd.DistributedGradientTape(tape).gradient(loss, w)

        self.assertAllClose(self.run_ops(grad), np.full(2, (size + 1) / 2))

    def test_distributed_gradient_tape_sparse(self):
        """An IndexedSlices gradient is gathered; sparse_as_dense reduces it densely."""
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        emb = tf.Variable(tf.ones([size + 1, 2]))

        def grads() -> list[Any]:
            out = []
            for sparse_as_dense in (False, True):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum(tf.gather(emb, [rank]))
                tape = hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
                out.append(tape.gradient(loss, emb))
            return out

        sparse, dense = self.run_ops(grads)
        self.assertTrue(isinstance(sparse, tf.IndexedSlices))
        want = np.zeros([size + 1, 2])
        want[:size] = 1 / size
        self.assertAllClose(tf.convert_to_tensor(sparse), want)
        self.assertAllClose(dense, want)

    def _partial_model(self) -> tuple[Any, Any]:
        keras.utils.set_random_seed(7)
        local = keras.layers.Embedding(4, 2)
        shared = keras.layers.Dense(1)
        model = keras.Sequential([keras.Input((1,), dtype="int32"), local, keras.layers.Flatten(),
                                  shared])  # fmt: skip
        return model, local

    def test_partial_distributed_gradient_tape(self):
        """A local layer's gradients stay local (divided by the size, as Horovod scales them),
        also when they are IndexedSlices; the others are averaged."""
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        model, local = self._partial_model()
        x = tf.constant([[rank % 4]])

        def grads() -> list[Any]:
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(x)) * float(rank + 1)
            tape = hvd.PartialDistributedGradientTape(tape, local_layers=[local])
            return tape.gradient(loss, model.trainable_variables)

        def local_grads() -> list[Any]:
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(x)) * float(rank + 1)
            return tape.gradient(loss, model.trainable_variables)

        got = self.run_ops(grads)
        mine = local_grads()
        self.assertTrue(isinstance(got[0], tf.IndexedSlices))
        self.assertAllClose(tf.convert_to_tensor(got[0]), tf.convert_to_tensor(mine[0]) / size)
        for g, m in zip(got[1:], mine[1:], strict=True):
            self.assertAllClose(g, hvd.allreduce(m))

    def test_partial_distributed_gradient_tape_local_layers_error(self):
        hvd.init()
        with tf.GradientTape() as tape:
            pass
        with self.assertRaises(ValueError):
            hvd.PartialDistributedGradientTape(tape, local_layers=["not a layer"])

    # ----- SyncBatchNormalization ---------------------------------------------------------------
    def test_horovod_syncbn_cpu(self):
        """Each rank normalizes its own sample with the whole batch's statistics: as one
        BatchNormalization over every rank's samples."""
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        x_list = [
            np.stack([np.array([[r, r + 1], [r * 2, r * 2 + 1], [r * 3, r * 3 + 1],
                                [r * 4, r * 4 + 1]], dtype=np.float32) for r in range(size)]),
            np.stack([np.array([[r + 1], [r * 2 + 1], [r * 3 + 1], [r * 4 + 1]],
                               dtype=np.float32) for r in range(size)]),
        ]  # fmt: skip
        for x in x_list:
            bn = keras.layers.BatchNormalization(axis=1)
            sync_bn = hvd.SyncBatchNormalization(axis=1)
            bn_out = bn(x, training=True)
            mine = tf.constant(x[rank : rank + 1])
            sync_out = self.run_ops(lambda s=sync_bn, m=mine: s(m, training=True))
            self.assertAllClose(sync_out, bn_out[rank : rank + 1], rtol=1e-4, atol=1e-4)
            self.assertAllClose(sync_bn.moving_mean, bn.moving_mean, rtol=1e-4, atol=1e-4)
            self.assertAllClose(sync_bn.moving_variance, bn.moving_variance, rtol=1e-4, atol=1e-4)

    def test_horovod_syncbn_fused_error(self):
        hvd.init()
        with self.assertRaises(ValueError):
            hvd.SyncBatchNormalization(fused=True)


class TensorFlowEagerTests(_TensorFlowTests, tf.test.TestCase):
    """Every test's ops run eagerly."""

    eager = True

    def run_ops(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


class TensorFlowFunctionTests(_TensorFlowTests, tf.test.TestCase):
    """Every test's ops are traced into a tf.function, then run (without AutoGraph, which has
    nothing to convert here and would parse this file again for every lambda)."""

    eager = False

    def run_ops(self, fn: Callable[..., Any], *args: Any) -> Any:
        return tf.function(fn, autograph=False)(*args)
