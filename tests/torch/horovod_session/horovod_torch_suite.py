"""A Horovod user's test module for the torch API, with only the import changed.

Written the way Horovod's own test/parallel/test_torch.py is (a `unittest.TestCase` whose tests
each call `hvd.init()`; some fail on purpose and expect the exception; some shut Horovod down
and start it again; join sequences; process sets added and removed; every alltoall variant;
sparse reductions; optimizer state broadcast), and run the way such suites run: one pytest
session per rank, every test one after another in the same process (alphabetical order, as
pytest runs unittest classes). The name keeps the outer pytest from collecting it:
`session.run_session` runs it inside each rank of a hora job.
"""

from __future__ import annotations

import inspect
import itertools
import os
import tempfile
import unittest
import warnings
from collections.abc import Iterable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import hora.torch as hvd  # was: import horovod.torch as hvd

INTEGRAL = [torch.IntTensor, torch.LongTensor, torch.cuda.IntTensor, torch.cuda.LongTensor]


def trunc_div(t: torch.Tensor, s: int) -> torch.Tensor:
    """Horovod's integer Average: scaled by 1/size in double and truncated back."""
    if t.dtype.is_floating_point:
        return t / s
    return torch.div(t, s, rounding_mode="trunc")


class TorchTests(unittest.TestCase):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        warnings.simplefilter("module")

    def convert_cpu_fp16_to_fp32(self, *values):
        return [v.float() if v.dtype == torch.float16 and not v.is_cuda else v for v in values]

    def cast_and_place(self, tensor, dtype):
        if dtype.is_cuda:
            return tensor.cuda(hvd.local_rank()).type(dtype)
        return tensor.type(dtype)

    def even_odd_sets(self):
        rank, size = hvd.rank(), hvd.size()
        even_ranks = [rk for rk in range(size) if rk % 2 == 0]
        odd_ranks = [rk for rk in range(size) if rk % 2 == 1]
        even_set = hvd.add_process_set(even_ranks)
        odd_set = hvd.add_process_set(odd_ranks)
        if rank in even_ranks:
            return even_set, odd_set, even_set, even_ranks
        return even_set, odd_set, odd_set, odd_ranks

    # ----- basics ------------------------------------------------------------------------------
    def test_horovod_reinit(self):
        """init -> shutdown -> init gives the same rank and size."""
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        hvd.shutdown()
        hvd.init()
        self.assertEqual((rank, size), (hvd.rank(), hvd.size()))

    def test_horovod_is_initialized(self):
        hvd.init()
        assert hvd.is_initialized()
        hvd.shutdown()
        assert not hvd.is_initialized()
        hvd.init()

    def test_horovod_rank(self):
        hvd.init()
        self.assertEqual(hvd.rank(), int(os.environ["HOROVOD_RANK"]))

    def test_horovod_size(self):
        hvd.init()
        self.assertEqual(hvd.size(), int(os.environ["HOROVOD_SIZE"]))

    # ----- allreduce ---------------------------------------------------------------------------
    def test_horovod_allreduce(self):
        """Sum of 1D, 2D, 3D tensors of every dtype."""
        hvd.init()
        size = hvd.size()
        dtypes = [torch.IntTensor, torch.LongTensor, torch.FloatTensor, torch.DoubleTensor]
        dtypes += [torch.HalfTensor]
        for dtype, dim in itertools.product(dtypes, [1, 2, 3]):
            torch.manual_seed(1234)
            tensor = torch.FloatTensor(*([17] * dim)).random_(-100, 100)
            tensor = self.cast_and_place(tensor, dtype)
            summed = hvd.allreduce(tensor, average=False)
            tensor, summed = self.convert_cpu_fp16_to_fp32(tensor, summed)
            multiplied = tensor * size
            assert torch.allclose(summed, multiplied, 0), "hvd.allreduce produces wrong results"

    def test_horovod_allreduce_average(self):
        hvd.init()
        dtypes = [torch.IntTensor, torch.LongTensor, torch.FloatTensor, torch.DoubleTensor]
        for dtype, dim in itertools.product(dtypes, [1, 2, 3]):
            torch.manual_seed(1234)
            tensor = torch.FloatTensor(*([17] * dim)).random_(-100, 100)
            tensor = self.cast_and_place(tensor, dtype)
            averaged = hvd.allreduce(tensor, average=True)
            assert torch.allclose(averaged, tensor, 0), "hvd.allreduce produces wrong results"

    def test_horovod_allreduce_inplace(self):
        hvd.init()
        size = hvd.size()
        dtypes = [torch.IntTensor, torch.LongTensor, torch.FloatTensor, torch.DoubleTensor]
        for dtype, dim in itertools.product(dtypes, [1, 2, 3]):
            torch.manual_seed(1234)
            tensor = torch.FloatTensor(*([17] * dim)).random_(-100, 100)
            multiplied = self.cast_and_place(tensor * size, dtype)
            tensor = self.cast_and_place(tensor, dtype)
            hvd.allreduce_(tensor, average=False)
            assert torch.allclose(tensor, multiplied, 0), "hvd.allreduce_ produces wrong results"

    def test_horovod_allreduce_async_fused(self):
        hvd.init()
        size = hvd.size()
        dtypes = [torch.IntTensor, torch.LongTensor, torch.FloatTensor, torch.DoubleTensor]
        tests = []
        is_hvd_poll_false_once = False
        for dtype, dim in itertools.product(dtypes, [1, 2, 3]):
            torch.manual_seed(1234)
            tensor = torch.FloatTensor(*([17] * dim)).random_(-100, 100)
            tensor = self.cast_and_place(tensor, dtype)
            handle = hvd.allreduce_async(tensor, average=False)
            if not hvd.poll(handle):
                is_hvd_poll_false_once = True
            multiplied = tensor * size
            tests.append((dtype, multiplied, handle))
        assert is_hvd_poll_false_once, "hvd.poll() always returns True, not an async op?"
        for _dtype, multiplied, handle in tests:
            summed = hvd.synchronize(handle)
            assert torch.allclose(summed, multiplied, 0), "hvd.allreduce produces wrong results"

    def test_horovod_allreduce_prescale(self):
        hvd.init()
        size = hvd.size()
        dtypes = [torch.IntTensor, torch.LongTensor, torch.FloatTensor, torch.DoubleTensor]
        for dtype, dim in itertools.product(dtypes, [1, 2, 3]):
            torch.manual_seed(1234)
            np.random.seed(1234)
            factor = np.random.uniform()
            tensor = torch.FloatTensor(*([17] * dim)).random_(-100, 100)
            tensor = self.cast_and_place(tensor, dtype)
            summed = hvd.allreduce(tensor, average=False, prescale_factor=factor)
            factor = torch.tensor(factor, dtype=torch.float64)
            if tensor.dtype.is_floating_point:
                expected = tensor * (factor.to(tensor.dtype) * size)
                assert torch.allclose(summed, expected, 1e-5), "prescale gives wrong results"
            else:
                expected = ((tensor.double() * factor).to(tensor.dtype)) * size
                assert torch.equal(summed, expected), "prescale gives wrong results"

    def test_horovod_allreduce_postscale(self):
        hvd.init()
        size = hvd.size()
        dtypes = [torch.IntTensor, torch.LongTensor, torch.FloatTensor, torch.DoubleTensor]
        for dtype, dim in itertools.product(dtypes, [1, 2, 3]):
            torch.manual_seed(1234)
            np.random.seed(1234)
            factor = np.random.uniform()
            tensor = torch.FloatTensor(*([17] * dim)).random_(-100, 100)
            tensor = self.cast_and_place(tensor, dtype)
            summed = hvd.allreduce(tensor, average=False, postscale_factor=factor)
            factor = torch.tensor(factor, dtype=torch.float64)
            if tensor.dtype.is_floating_point:
                expected = tensor * (factor.to(tensor.dtype) * size)
                assert torch.allclose(summed, expected, 1e-5), "postscale gives wrong results"
            else:
                expected = (tensor.double() * size * factor).to(tensor.dtype)
                assert torch.equal(summed, expected), "postscale gives wrong results"

    def test_horovod_allreduce_process_sets(self):
        hvd.init()
        even_set, odd_set, this_set, set_ranks = self.even_odd_sets()
        dtypes = [torch.IntTensor, torch.LongTensor, torch.FloatTensor, torch.DoubleTensor]
        for dtype, dim in itertools.product(dtypes, [1, 2, 3]):
            torch.manual_seed(1234)
            even_rank_tensor = torch.FloatTensor(*([17] * dim)).random_(-100, 100)
            odd_rank_tensor = torch.FloatTensor(*([17] * dim)).random_(-100, 100)
            mine = even_rank_tensor if hvd.rank() % 2 == 0 else odd_rank_tensor
            mine = self.cast_and_place(mine, dtype)
            summed = hvd.allreduce(mine, average=False, process_set=this_set)
            multiplied = mine * len(set_ranks)
            assert torch.allclose(summed, multiplied, 0), "process set allreduce is wrong"
        hvd.remove_process_set(odd_set)
        hvd.remove_process_set(even_set)

    def test_horovod_allreduce_error(self):
        """A shape that differs between ranks raises on every rank."""
        hvd.init()
        rank = hvd.rank()
        if hvd.size() == 1:
            self.skipTest("Only one worker available")
        dims = [17 + rank] * 3
        tensor = torch.FloatTensor(*dims).random_(-100, 100)
        try:
            hvd.allreduce(tensor)
            raise AssertionError("hvd.allreduce did not throw error")
        except (torch.FatalError, RuntimeError):
            pass
        # Same shape, different number of dimensions.
        dims = [17] * 3 if rank % 2 == 0 else [17] * 2
        try:
            hvd.allreduce(torch.FloatTensor(*dims).random_(-100, 100))
            raise AssertionError("hvd.allreduce did not throw error")
        except (torch.FatalError, RuntimeError):
            pass

    def test_horovod_allreduce_type_error(self):
        hvd.init()
        rank = hvd.rank()
        if hvd.size() == 1:
            self.skipTest("Only one worker available")
        dims = [17] * 3
        tensor = torch.IntTensor(*dims) if rank % 2 == 0 else torch.FloatTensor(*dims)
        try:
            hvd.allreduce(tensor)
            raise AssertionError("hvd.allreduce did not throw error")
        except (torch.FatalError, RuntimeError):
            pass

    def test_horovod_allreduce_op_error(self):
        hvd.init()
        if hvd.size() == 1:
            self.skipTest("Only one worker available")
        op = hvd.Max if hvd.rank() % 2 == 0 else hvd.Min
        try:
            hvd.allreduce(torch.ones(4), op=op)
            raise AssertionError("hvd.allreduce did not throw error")
        except (torch.FatalError, RuntimeError):
            pass
        # The failed op poisons nothing: the next one works.
        self.assertEqual(hvd.allreduce(torch.ones(4), op=hvd.Sum).tolist(), [hvd.size()] * 4)

    def test_horovod_allreduce_duplicate_name_error(self):
        hvd.init()
        size, rank = hvd.size(), hvd.rank()
        if size == 1:
            self.skipTest("Only one worker available")
        tensor = torch.FloatTensor(*([17] * 3))
        if rank == 0:
            hvd.allreduce_async(tensor, name="duplicate_name")
            try:
                for _ in range(10):
                    hvd.allreduce_async(tensor, name="duplicate_name")
                raise AssertionError("hvd.allreduce_async did not throw error")
            except (torch.FatalError, ValueError):
                pass
        hvd.barrier()
        if rank > 0:
            hvd.allreduce_async(tensor, name="duplicate_name")
            try:
                hvd.allreduce_async(tensor, name="duplicate_name")
                raise AssertionError("hvd.allreduce_async did not throw error")
            except (torch.FatalError, ValueError):
                pass
        hvd.barrier()

    def test_horovod_allreduce_grad(self):
        hvd.init()
        size = hvd.size()
        for dtype, dim in itertools.product([torch.FloatTensor, torch.DoubleTensor], [1, 2, 3]):
            torch.manual_seed(1234)
            tensor = torch.FloatTensor(*([17] * dim)).random_(-100, 100)
            tensor = self.cast_and_place(tensor, dtype)
            tensor.requires_grad_()
            summed = hvd.allreduce(tensor, average=False)
            summed.backward(self.cast_and_place(torch.ones([17] * dim), dtype))
            grad_out = tensor.grad.data.cpu().numpy()
            expected = np.ones([17] * dim) * size
            err = np.linalg.norm(expected - grad_out)
            self.assertLess(
                err, 0.00000001, f"gradient {grad_out} differs from expected {expected}"
            )

    def test_horovod_allreduce_grad_average(self):
        hvd.init()
        for dtype, dim in itertools.product([torch.FloatTensor, torch.DoubleTensor], [1, 2, 3]):
            torch.manual_seed(1234)
            tensor = torch.FloatTensor(*([17] * dim)).random_(-100, 100)
            tensor = self.cast_and_place(tensor, dtype)
            tensor.requires_grad_()
            summed = hvd.allreduce(tensor, average=True)
            summed.backward(self.cast_and_place(torch.ones([17] * dim), dtype))
            err = np.linalg.norm(np.ones([17] * dim) - tensor.grad.data.cpu().numpy())
            self.assertLess(err, 0.00000001)

    def test_horovod_grouped_allreduce(self):
        hvd.init()
        size = hvd.size()
        dtypes = [torch.IntTensor, torch.LongTensor, torch.FloatTensor, torch.DoubleTensor]
        for dtype, dim in itertools.product(dtypes, [1, 2, 3]):
            torch.manual_seed(1234)
            tensors = [torch.FloatTensor(*([17] * dim)).random_(-100, 100) for _ in range(5)]
            tensors = [self.cast_and_place(t, dtype) for t in tensors]
            summed = hvd.grouped_allreduce(tensors, average=False)
            for s, t in zip(summed, tensors, strict=True):
                assert torch.allclose(s, t * size, 0), "grouped allreduce is wrong"

    def test_horovod_grouped_allreduce_inplace(self):
        hvd.init()
        size = hvd.size()
        torch.manual_seed(1234)
        tensors = [torch.FloatTensor(17, 3).random_(-100, 100) for _ in range(5)]
        multiplied = [t * size for t in tensors]
        hvd.grouped_allreduce_(tensors, average=False)
        for t, m in zip(tensors, multiplied, strict=True):
            assert torch.allclose(t, m, 0)

    # ----- allgather ---------------------------------------------------------------------------
    def test_horovod_allgather(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        dtypes = [
            torch.ByteTensor,
            torch.CharTensor,
            torch.ShortTensor,
            torch.IntTensor,
            torch.LongTensor,
            torch.FloatTensor,
            torch.DoubleTensor,
            torch.HalfTensor,
        ]
        for dtype, dim in itertools.product(dtypes, [1, 2, 3]):
            tensor = torch.FloatTensor(*([17] * dim)).fill_(1).mul_(rank)
            tensor = self.cast_and_place(tensor, dtype)
            gathered = hvd.allgather(tensor)
            tensor, gathered = self.convert_cpu_fp16_to_fp32(tensor, gathered)
            assert list(gathered.shape) == [17 * size] + [17] * (dim - 1)
            for i in range(size):
                rank_tensor = gathered[i * 17 : (i + 1) * 17]
                assert list(rank_tensor.shape) == [17] * dim
                assert rank_tensor.data.min() == i and rank_tensor.data.max() == i

    def test_horovod_allgather_variable_size(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        for dim in [1, 2, 3]:
            tensor_sizes = [17, 32, 81, 12, 15, 23, 22][:size]
            tensor_sizes = tensor_sizes * (size // len(tensor_sizes) + 1)
            tensor_sizes = tensor_sizes[:size]
            tensor = torch.FloatTensor(*([tensor_sizes[rank]] + [17] * (dim - 1))).fill_(1)
            tensor = tensor.mul_(rank)
            gathered = hvd.allgather(tensor)
            expected_size = sum(tensor_sizes)
            assert list(gathered.shape) == [expected_size] + [17] * (dim - 1)
            for i in range(size):
                rank_size = [tensor_sizes[i]] + [17] * (dim - 1)
                start = sum(tensor_sizes[:i])
                rank_tensor = gathered[start : start + tensor_sizes[i]]
                assert list(rank_tensor.shape) == rank_size
                assert rank_tensor.data.min() == i and rank_tensor.data.max() == i

    def test_horovod_allgather_async_fused(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        tests = []
        is_hvd_poll_false_once = False
        for dtype, dim in itertools.product(
            [torch.IntTensor, torch.FloatTensor, torch.DoubleTensor], [1, 2, 3]
        ):
            rank_shape = [17] * dim
            tensor = torch.FloatTensor(*rank_shape).fill_(1).mul_(rank)
            tensor = self.cast_and_place(tensor, dtype)
            handle = hvd.allgather_async(tensor)
            if not hvd.poll(handle):
                is_hvd_poll_false_once = True
            tests.append((handle, rank_shape))
        assert is_hvd_poll_false_once, "hvd.poll() always returns True, not an async op?"
        for handle, rank_shape in tests:
            gathered = hvd.synchronize(handle)
            for i in range(size):
                rank_tensor = gathered[i * 17 : (i + 1) * 17]
                assert list(rank_tensor.shape) == rank_shape
                assert rank_tensor.data.min() == i and rank_tensor.data.max() == i

    def test_horovod_allgather_process_sets(self):
        hvd.init()
        rank = hvd.rank()
        even_set, odd_set, this_set, set_ranks = self.even_odd_sets()
        for dtype, dim in itertools.product([torch.IntTensor, torch.FloatTensor], [1, 2, 3]):
            tensor = torch.FloatTensor(*([17] * dim)).fill_(1).mul_(rank)
            tensor = self.cast_and_place(tensor, dtype)
            gathered = hvd.allgather(tensor, process_set=this_set)
            assert list(gathered.shape) == [17 * len(set_ranks)] + [17] * (dim - 1)
            for i, this_rank in enumerate(set_ranks):
                rank_tensor = gathered[i * 17 : (i + 1) * 17]
                assert rank_tensor.data.min() == this_rank
        hvd.remove_process_set(odd_set)
        hvd.remove_process_set(even_set)

    def test_horovod_allgather_error(self):
        hvd.init()
        rank = hvd.rank()
        if hvd.size() == 1:
            self.skipTest("Only one worker available")
        tensor_size = [17] * 3
        tensor_size[1] = 10 * (rank + 1)
        tensor = torch.FloatTensor(*tensor_size).fill_(1).mul_(rank)
        try:
            hvd.allgather(tensor)
            raise AssertionError("hvd.allgather did not throw error")
        except (torch.FatalError, RuntimeError):
            pass

    def test_horovod_allgather_type_error(self):
        hvd.init()
        rank = hvd.rank()
        if hvd.size() == 1:
            self.skipTest("Only one worker available")
        tensor_size = [17] * 3
        tensor = torch.IntTensor(*tensor_size) if rank % 2 == 0 else torch.FloatTensor(*tensor_size)
        try:
            hvd.allgather(tensor)
            raise AssertionError("hvd.allgather did not throw error")
        except (torch.FatalError, RuntimeError):
            pass

    def test_horovod_allgather_duplicate_name_error(self):
        hvd.init()
        size, rank = hvd.size(), hvd.rank()
        if size == 1:
            self.skipTest("Only one worker available")
        tensor = torch.FloatTensor(*([17] * 3))
        if rank == 0:
            hvd.allgather_async(tensor, name="duplicate_name")
            try:
                for _ in range(10):
                    hvd.allgather_async(tensor, name="duplicate_name")
                raise AssertionError("hvd.allgather_async did not throw error")
            except (torch.FatalError, ValueError):
                pass
        hvd.barrier()
        if rank > 0:
            hvd.allgather_async(tensor, name="duplicate_name")
            try:
                hvd.allgather_async(tensor, name="duplicate_name")
                raise AssertionError("hvd.allgather_async did not throw error")
            except (torch.FatalError, ValueError):
                pass
        hvd.barrier()

    def test_horovod_allgather_grad(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        for dtype, dim in itertools.product([torch.FloatTensor, torch.DoubleTensor], [1, 2, 3]):
            tensor_sizes = ([3, 2, 7, 4, 6, 8, 10] * 5)[:size]
            tensor = torch.FloatTensor(*([tensor_sizes[rank]] + [17] * (dim - 1))).fill_(1)
            tensor = self.cast_and_place(tensor.mul_(rank), dtype)
            tensor.requires_grad_()
            grad_list = []
            for r, tensor_size in enumerate(tensor_sizes):
                grad_list.append(torch.ones([tensor_size] + [17] * (dim - 1)) * r)
            grad_ys = self.cast_and_place(torch.cat(grad_list, dim=0), dtype)
            gathered = hvd.allgather(tensor)
            gathered.backward(grad_ys)
            grad_out = tensor.grad.data.cpu().numpy()
            expected = np.ones([tensor_sizes[rank]] + [17] * (dim - 1)) * rank
            err = np.linalg.norm(expected - grad_out)
            self.assertLess(err, 0.00000001)

    def test_horovod_grouped_allgather(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        for dtype, dim in itertools.product([torch.IntTensor, torch.FloatTensor], [1, 2, 3]):
            tensors = [
                self.cast_and_place(torch.FloatTensor(*([17] * dim)).fill_(1).mul_(rank), dtype)
                for _ in range(5)
            ]
            gathered = hvd.grouped_allgather(tensors)
            for g in gathered:
                assert list(g.shape) == [17 * size] + [17] * (dim - 1)
                for i in range(size):
                    assert g[i * 17 : (i + 1) * 17].data.max() == i

    # ----- broadcast ---------------------------------------------------------------------------
    def test_horovod_broadcast(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        if size == 1:
            self.skipTest("Only one worker available")
        dtypes = [
            torch.ByteTensor,
            torch.CharTensor,
            torch.ShortTensor,
            torch.IntTensor,
            torch.LongTensor,
            torch.FloatTensor,
            torch.DoubleTensor,
            torch.HalfTensor,
        ]
        for dtype, dim, root_rank in itertools.product(dtypes, [1, 2, 3], range(size)):
            tensor = torch.FloatTensor(*([17] * dim)).fill_(1).mul_(rank)
            root_tensor = torch.FloatTensor(*([17] * dim)).fill_(1).mul_(root_rank)
            tensor = self.cast_and_place(tensor, dtype)
            root_tensor = self.cast_and_place(root_tensor, dtype)
            broadcasted_tensor = hvd.broadcast(tensor, root_rank)
            tensor, root_tensor, broadcasted_tensor = self.convert_cpu_fp16_to_fp32(
                tensor, root_tensor, broadcasted_tensor
            )
            if rank != root_rank:
                assert (tensor == root_tensor).max() == 0, "hvd.broadcast modifies source tensor"
            assert (broadcasted_tensor.data == root_tensor).min() == 1, "hvd.broadcast is wrong"

    def test_horovod_broadcast_inplace(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        if size == 1:
            self.skipTest("Only one worker available")
        dtypes = [torch.IntTensor, torch.LongTensor, torch.FloatTensor, torch.DoubleTensor]
        for dtype, dim, root_rank in itertools.product(dtypes, [1, 2, 3], range(size)):
            tensor = torch.FloatTensor(*([17] * dim)).fill_(1).mul_(rank)
            root_tensor = torch.FloatTensor(*([17] * dim)).fill_(1).mul_(root_rank)
            tensor = self.cast_and_place(tensor, dtype)
            root_tensor = self.cast_and_place(root_tensor, dtype)
            broadcasted_tensor = hvd.broadcast_(tensor, root_rank)
            assert (tensor == broadcasted_tensor).min() == 1, "hvd.broadcast_ not in place"
            assert (broadcasted_tensor == root_tensor).min() == 1, "hvd.broadcast_ is wrong"

    def test_horovod_broadcast_process_sets(self):
        hvd.init()
        rank = hvd.rank()
        even_set, odd_set, this_set, set_ranks = self.even_odd_sets()
        for dtype, dim, root_rank in itertools.product(
            [torch.IntTensor, torch.FloatTensor], [1, 2, 3], set_ranks
        ):
            tensor = self.cast_and_place(
                torch.FloatTensor(*([17] * dim)).fill_(1).mul_(rank), dtype
            )
            root_tensor = torch.FloatTensor(*([17] * dim)).fill_(1).mul_(root_rank)
            root_tensor = self.cast_and_place(root_tensor, dtype)
            broadcasted_tensor = hvd.broadcast(tensor, root_rank, process_set=this_set)
            assert (broadcasted_tensor.data == root_tensor).min() == 1
        hvd.remove_process_set(odd_set)
        hvd.remove_process_set(even_set)

    def test_horovod_broadcast_error(self):
        hvd.init()
        rank = hvd.rank()
        if hvd.size() == 1:
            self.skipTest("Only one worker available")
        tensor_size = [17] * 3
        tensor_size[1] = 10 * (rank + 1)
        tensor = torch.FloatTensor(*tensor_size).fill_(1).mul_(rank)
        try:
            hvd.broadcast(tensor, 0)
            raise AssertionError("hvd.broadcast did not throw error")
        except (torch.FatalError, RuntimeError):
            pass

    def test_horovod_broadcast_type_error(self):
        hvd.init()
        rank = hvd.rank()
        if hvd.size() == 1:
            self.skipTest("Only one worker available")
        tensor_size = [17] * 3
        tensor = torch.IntTensor(*tensor_size) if rank % 2 == 0 else torch.FloatTensor(*tensor_size)
        try:
            hvd.broadcast(tensor, 0)
            raise AssertionError("hvd.broadcast did not throw error")
        except (torch.FatalError, RuntimeError):
            pass

    def test_horovod_broadcast_rank_error(self):
        hvd.init()
        rank = hvd.rank()
        if hvd.size() == 1:
            self.skipTest("Only one worker available")
        tensor = torch.FloatTensor(*([17] * 3)).fill_(1)
        try:
            hvd.broadcast(tensor, rank)
            raise AssertionError("hvd.broadcast did not throw error")
        except (torch.FatalError, RuntimeError):
            pass

    def test_horovod_broadcast_duplicate_name_error(self):
        hvd.init()
        size, rank = hvd.size(), hvd.rank()
        if size == 1:
            self.skipTest("Only one worker available")
        tensor = torch.FloatTensor(*([17] * 3))
        if rank == 0:
            hvd.broadcast_async(tensor, name="duplicate_name", root_rank=0)
            try:
                for _ in range(10):
                    hvd.broadcast_async(tensor, name="duplicate_name", root_rank=0)
                raise AssertionError("hvd.broadcast_async did not throw error")
            except (torch.FatalError, ValueError):
                pass
        hvd.barrier()
        if rank > 0:
            hvd.broadcast_async(tensor, name="duplicate_name", root_rank=0)
            try:
                hvd.broadcast_async(tensor, name="duplicate_name", root_rank=0)
                raise AssertionError("hvd.broadcast_async did not throw error")
            except (torch.FatalError, ValueError):
                pass
        hvd.barrier()

    def test_horovod_broadcast_grad(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        if size == 1:
            self.skipTest("Only one worker available")
        for dtype, dim, root_rank in itertools.product(
            [torch.FloatTensor, torch.DoubleTensor], [1, 2, 3], range(size)
        ):
            tensor = torch.FloatTensor(*([17] * dim)).fill_(1).mul_(rank)
            tensor = self.cast_and_place(tensor, dtype)
            tensor.requires_grad_()
            broadcasted_tensor = hvd.broadcast(tensor, root_rank)
            broadcasted_tensor.backward(self.cast_and_place(torch.ones([17] * dim), dtype))
            grad_out = tensor.grad.data.cpu().numpy()
            c = 1 if rank == root_rank else 0
            expected = np.ones([17] * dim) * c
            err = np.linalg.norm(expected - grad_out)
            self.assertLess(err, 0.00000001)

    # ----- alltoall ----------------------------------------------------------------------------
    A2A_DTYPES = (
        torch.ByteTensor,
        torch.CharTensor,
        torch.ShortTensor,
        torch.IntTensor,
        torch.LongTensor,
        torch.FloatTensor,
        torch.DoubleTensor,
        torch.HalfTensor,
    )

    def a2a_tensor(self, rank, ranks, dim, dtype):
        vals = []
        for i in ranks:
            vals += [i] * (rank + 1)
        tensor = torch.Tensor(vals)
        for _ in range(dim - 1):
            tensor = tensor.unsqueeze(1)
            tensor = torch.cat((tensor, tensor), dim=1)
        return self.cast_and_place(tensor, dtype)

    def test_horovod_alltoall(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        for dtype, dim in itertools.product(self.A2A_DTYPES, [1, 2, 3]):
            tensor = self.a2a_tensor(rank, range(size), dim, dtype)
            splits = torch.tensor([rank + 1] * size, dtype=torch.int32)
            collected, received_splits = hvd.alltoall(tensor, splits)
            tensor, collected = self.convert_cpu_fp16_to_fp32(tensor, collected)
            assert collected.data.min() == rank and collected.data.max() == rank
            assert collected.numel() == size * (size + 1) // 2 * 2 ** (dim - 1)
            self.assertSequenceEqual(
                received_splits.tolist(), [rk + 1 for rk in range(size)], "wrong splits"
            )

    def test_horovod_alltoall_equal_split(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        for dtype, dim in itertools.product(self.A2A_DTYPES, [1, 2, 3]):
            tensor = self.a2a_tensor(rank, range(size), dim, dtype)
            collected = hvd.alltoall(tensor)
            tensor, collected = self.convert_cpu_fp16_to_fp32(tensor, collected)
            assert collected.data.min() == rank and collected.data.max() == rank
            assert collected.numel() == size * (size + 1) // 2 * 2 ** (dim - 1)

    def test_horovod_alltoall_equal_split_grad(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        for dtype, dim in itertools.product([torch.FloatTensor, torch.DoubleTensor], [1, 2, 3]):
            tensor = self.a2a_tensor(rank, range(size), dim, dtype)
            tensor.requires_grad_()
            collected = hvd.alltoall(tensor)
            collected.backward(self.cast_and_place(torch.ones(collected.shape), dtype))
            grad_out = tensor.grad.data.cpu().numpy()
            err = np.linalg.norm(np.ones(tensor.shape) - grad_out)
            self.assertLess(err, 0.00000001)

    def test_horovod_alltoall_equal_split_length_error(self):
        hvd.init()
        size = hvd.size()
        if size == 1:
            self.skipTest("Only one worker available")
        tensor = torch.empty(size + 1)
        try:
            hvd.alltoall(tensor)
            raise AssertionError("hvd.alltoall did not throw error")
        except (torch.FatalError, ValueError):
            pass

    def test_horovod_alltoall_grad(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        for dtype, dim in itertools.product([torch.FloatTensor, torch.DoubleTensor], [1, 2, 3]):
            tensor = self.a2a_tensor(rank, range(size), dim, dtype)
            tensor.requires_grad_()
            splits = torch.tensor([rank + 1] * size, dtype=torch.int32)
            collected, _ = hvd.alltoall(tensor, splits)
            collected.backward(self.cast_and_place(torch.ones(collected.shape), dtype))
            grad_out = tensor.grad.data.cpu().numpy()
            err = np.linalg.norm(np.ones(tensor.shape) - grad_out)
            self.assertLess(err, 0.00000001)

    def test_horovod_alltoall_grad_process_sets(self):
        hvd.init()
        rank = hvd.rank()
        even_set, odd_set, this_set, set_ranks = self.even_odd_sets()
        for dtype, dim in itertools.product([torch.FloatTensor, torch.DoubleTensor], [1, 2, 3]):
            tensor = self.a2a_tensor(rank, set_ranks, dim, dtype)
            tensor.requires_grad_()
            splits = torch.tensor([rank + 1] * len(set_ranks), dtype=torch.int32)
            collected, _ = hvd.alltoall(tensor, splits, process_set=this_set)
            collected.backward(self.cast_and_place(torch.ones(collected.shape), dtype))
            err = np.linalg.norm(np.ones(tensor.shape) - tensor.grad.data.cpu().numpy())
            self.assertLess(err, 0.00000001)
        hvd.remove_process_set(odd_set)
        hvd.remove_process_set(even_set)

    def test_horovod_alltoall_process_sets(self):
        hvd.init()
        rank = hvd.rank()
        even_set, odd_set, this_set, set_ranks = self.even_odd_sets()
        for dtype, dim in itertools.product(self.A2A_DTYPES, [1, 2, 3]):
            tensor = self.a2a_tensor(rank, set_ranks, dim, dtype)
            splits = torch.tensor([rank + 1] * len(set_ranks), dtype=torch.int32)
            collected, received_splits = hvd.alltoall(tensor, splits, process_set=this_set)
            tensor, collected = self.convert_cpu_fp16_to_fp32(tensor, collected)
            assert collected.data.min() == rank and collected.data.max() == rank
            self.assertSequenceEqual(received_splits.tolist(), [rk + 1 for rk in set_ranks])
        hvd.remove_process_set(odd_set)
        hvd.remove_process_set(even_set)

    def test_horovod_alltoall_rank_error(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        if size == 1:
            self.skipTest("Only one worker available")
        tensor_size = [2 * size] * 3
        tensor_size[1] = 10 * (rank + 1)
        tensor = torch.ones(tensor_size)
        try:
            hvd.alltoall(tensor)
            raise AssertionError("hvd.alltoall did not throw error")
        except (torch.FatalError, RuntimeError):
            pass

    def test_horovod_alltoall_splits_error(self):
        hvd.init()
        size = hvd.size()
        if size == 1:
            self.skipTest("Only one worker available")
        tensor = torch.empty(size - 1)
        splits = torch.ones(size, dtype=torch.int32)
        try:
            hvd.alltoall(tensor, splits)
            raise AssertionError("hvd.alltoall did not throw error")
        except (torch.FatalError, ValueError):
            pass

    def test_horovod_alltoall_splits_on_gpu(self):
        if not torch.cuda.is_available():
            self.skipTest("No GPUs available")
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        for dim in [1, 2, 3]:
            tensor = self.a2a_tensor(rank, range(size), dim, torch.cuda.FloatTensor)
            splits = torch.tensor([rank + 1] * size, dtype=torch.int32, device="cuda")
            collected, received_splits = hvd.alltoall(tensor, splits)
            assert collected.data.min() == rank and collected.data.max() == rank
            self.assertSequenceEqual(received_splits.tolist(), [rk + 1 for rk in range(size)])

    def test_horovod_alltoall_splits_type_error(self):
        hvd.init()
        size = hvd.size()
        if size == 1:
            self.skipTest("Only one worker available")
        tensor = torch.empty(size)
        splits = torch.tensor([1.0] * size, dtype=torch.float32)
        try:
            hvd.alltoall(tensor, splits)
            raise AssertionError("hvd.alltoall did not throw error")
        except (torch.FatalError, ValueError):
            pass

    def test_horovod_alltoall_type_error(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        if size == 1:
            self.skipTest("Only one worker available")
        if rank % 2 == 0:
            tensor = torch.empty(size, dtype=torch.int32)
        else:
            tensor = torch.empty(size, dtype=torch.float32)
        try:
            hvd.alltoall(tensor)
            raise AssertionError("hvd.alltoall did not throw error")
        except (torch.FatalError, RuntimeError):
            pass

    # ----- reducescatter -----------------------------------------------------------------------
    def test_horovod_reducescatter(self):
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        for dtype, dim in itertools.product(
            [torch.IntTensor, torch.FloatTensor, torch.DoubleTensor], [1, 2, 3]
        ):
            torch.manual_seed(1234)
            tensor = torch.FloatTensor(*([size * 4] * dim)).random_(-100, 100)
            tensor = self.cast_and_place(tensor, dtype)
            summed = hvd.reducescatter(tensor, op=hvd.Sum)
            expected = tensor[rank * 4 : (rank + 1) * 4] * size
            assert list(summed.shape) == list(expected.shape)
            assert torch.allclose(summed, expected, 0)

    def test_horovod_reducescatter_error(self):
        hvd.init()
        rank = hvd.rank()
        if hvd.size() == 1:
            self.skipTest("Only one worker available")
        tensor_size = [17] * 3
        tensor_size[1] = 10 * (rank + 1)
        try:
            hvd.reducescatter(torch.FloatTensor(*tensor_size).fill_(1))
            raise AssertionError("hvd.reducescatter did not throw error")
        except (torch.FatalError, RuntimeError):
            pass

    # ----- join --------------------------------------------------------------------------------
    def test_horovod_join_allreduce(self):
        """Joined ranks contribute zeros; the average divides by the whole world."""
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        dtypes = [torch.IntTensor, torch.LongTensor, torch.FloatTensor, torch.DoubleTensor]
        for dtype, dim, first_join_rank, caching in itertools.product(
            dtypes, [1, 2, 3], [0, 1], [False, True]
        ):
            torch.manual_seed(1234)
            tensor_a = self.cast_and_place(
                torch.FloatTensor(*([5] * dim)).random_(-100, 100), dtype
            )
            tensor_b = self.cast_and_place(
                torch.FloatTensor(*([17] * dim)).random_(-100, 100), dtype
            )
            if caching:
                handle_a = hvd.allreduce_async(tensor_a, name="tensor_a", average=True)
                handle_b = hvd.allreduce_async(tensor_b, name="tensor_b", average=True)
                hvd.synchronize(handle_a)
                hvd.synchronize(handle_b)
            if rank == first_join_rank:
                ret = hvd.join()
            else:
                handle_a = hvd.allreduce_async(tensor_a, name="tensor_a", average=True)
                handle_b = hvd.allreduce_async(tensor_b, name="tensor_b", average=True)
                averaged_a = hvd.synchronize(handle_a)
                averaged_b = hvd.synchronize(handle_b)
                ret = hvd.join()
                assert torch.allclose(averaged_a, trunc_div(tensor_a * (size - 1), size), 0)
                assert torch.allclose(averaged_b, trunc_div(tensor_b * (size - 1), size), 0)
            self.assertNotEqual(ret, first_join_rank, "join() returned the first rank to join")
            ret_values = hvd.allgather_object(ret)
            self.assertSequenceEqual(ret_values, [ret] * size, "join() differs between ranks")

    def test_horovod_join_allgather(self):
        """Allgather is not supported once a rank has joined: the others get the error."""
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        if size == 1:
            self.skipTest("Only one worker available")
        tensor = torch.FloatTensor(*([17] * 3))
        if rank == 0:
            ret = hvd.join()
        else:
            try:
                hvd.allgather(tensor)
                raise AssertionError("hvd.allgather did not throw error")
            except (torch.FatalError, RuntimeError):
                pass
            ret = hvd.join(hvd.local_rank())
        self.assertNotEqual(ret, 0, "join() returned the first rank to join")
        ret_values = hvd.allgather_object(ret)
        self.assertSequenceEqual(ret_values, [ret] * size)

    def test_horovod_join_broadcast(self):
        """Broadcast is not supported once a rank has joined: the others get the error."""
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        if size == 1:
            self.skipTest("Only one worker available")
        tensor = torch.FloatTensor(*([17] * 3))
        if rank == 0:
            ret = hvd.join(hvd.local_rank())
        else:
            try:
                hvd.broadcast(tensor, 1, name="test_horovod_join_broadcast")
                raise AssertionError("hvd.broadcast did not throw error")
            except (torch.FatalError, RuntimeError):
                pass
            ret = hvd.join()
        self.assertNotEqual(ret, 0, "join() returned the first rank to join")
        ret_values = hvd.allgather_object(ret)
        self.assertSequenceEqual(ret_values, [ret] * size)

    # ----- objects, compression ----------------------------------------------------------------
    def test_broadcast_object(self):
        hvd.init()
        expected_obj = {"hello": 123, 0: [1, 2]}
        obj = expected_obj if hvd.rank() == 0 else {}
        obj = hvd.broadcast_object(obj, root_rank=0)
        self.assertDictEqual(obj, expected_obj)

    def test_allgather_object(self):
        hvd.init()
        d = {"metric_val_1": hvd.rank()}
        if hvd.rank() == 1:
            d["metric_val_2"] = 42
        results = hvd.allgather_object(d)
        expected = [{"metric_val_1": i} for i in range(hvd.size())]
        if hvd.size() > 1:
            expected[1] = {"metric_val_1": 1, "metric_val_2": 42}
        self.assertEqual(len(results), hvd.size())
        self.assertListEqual(results, expected)

    def test_compression_fp16(self):
        valid_dtypes = [torch.float32, torch.float64]
        invalid_dtypes = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
        compression = hvd.Compression.fp16
        for dtype in valid_dtypes:
            tensor = torch.ones([5] * 3, dtype=dtype)
            compressed, ctx = compression.compress(tensor)
            self.assertEqual(compressed.dtype, torch.float16)
            self.assertEqual(compression.decompress(compressed, ctx).dtype, dtype)
        for dtype in invalid_dtypes:
            tensor = torch.ones([5] * 3, dtype=dtype)
            compressed, ctx = compression.compress(tensor)
            self.assertEqual(compressed.dtype, dtype)

    # ----- sparse ------------------------------------------------------------------------------
    def test_async_sparse_allreduce(self):
        """Allgather of indices and values is equivalent to an allreduce of the dense tensors."""
        hvd.init()

        def random_sparse_tensor(*shape):
            t = torch.rand(*shape)
            t[t < 0.8] = 0
            return t.to_sparse()

        tensor_sizes = [(5, 4), (17, 3), (1, 9), (20, 1)]
        torch.manual_seed(1234 + hvd.rank())
        tensors = [random_sparse_tensor(d0, d1) for d0, d1 in tensor_sizes]
        allreduced_tensors = [hvd.allreduce(t.to_dense()) for t in tensors]
        handles = [
            hvd.sparse_allreduce_async(t, op=hvd.Average, name=str(i))
            for i, t in enumerate(tensors)
        ]
        allgathered_tensors = [hvd.synchronize(h) for h in handles]
        for reduced, gathered in zip(allreduced_tensors, allgathered_tensors, strict=True):
            assert gathered.is_sparse
            assert torch.allclose(reduced, gathered.to_dense(), 1e-6)

    def test_sparse_embeddings(self):
        """DistributedOptimizer aggregates sparse gradients, densified or not."""
        hvd.init()
        for sparse_as_dense in [False, True]:

            class Net(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.embedding = nn.Embedding(10, 3, sparse=True)

                def forward(self, x):
                    return self.embedding(x)

            model = Net()
            if hvd.rank() == 0:
                inp = torch.LongTensor([[1, 2, 4, 5], [4, 3, 2, 9]])
            else:
                inp = torch.LongTensor([[1, 3, 4], [4, 7, 9]])
            opt = torch.optim.SparseAdam(list(model.parameters()), lr=0.1)
            opt = hvd.DistributedOptimizer(opt, sparse_as_dense=sparse_as_dense)
            loss = model(inp).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()

    # ----- optimizer ---------------------------------------------------------------------------
    @staticmethod
    def optimizers():
        # L-BFGS is unsupported, as are sparse tensors (SparseAdam); only the optimizers that
        # take the bias vectors of a Linear model.
        names = ["ASGD", "Adadelta", "Adagrad", "Adam", "AdamW", "Adamax", "NAdam", "RAdam"]
        names += ["RMSprop", "Rprop", "SGD"]
        return [(n, getattr(torch.optim, n)) for n in names if hasattr(torch.optim, n)]

    @staticmethod
    def new_optimizer(cls, opt_params, model):
        p = {k: v for k, v in opt_params.items() if k in inspect.signature(cls.__init__).parameters}
        return cls(model.parameters(), **p)

    def test_broadcast_state(self):
        hvd.init()
        N, D_in, H, D_out = 64, 100, 10, 10
        x = torch.randn(N, D_in).requires_grad_()
        y = torch.randn(N, D_out).requires_grad_()

        def create_model(opt_class, opt_params):
            model = torch.nn.Sequential(
                torch.nn.Linear(D_in, H), torch.nn.ReLU(), torch.nn.Linear(H, D_out)
            )
            optimizer = self.new_optimizer(opt_class, opt_params, model)
            optimizer = hvd.DistributedOptimizer(
                optimizer, named_parameters=model.named_parameters()
            )
            return model, optimizer

        def get_model_param_values(model):
            params = sorted(model.state_dict().items())
            return [(k, v.clone()) for k, v in params]

        def get_optimizer_param_values(optimizer):
            results = []
            state_dict = optimizer.state_dict()
            for group in state_dict["param_groups"]:
                for param_id in group["params"]:
                    if param_id not in state_dict["state"]:
                        continue
                    params = sorted(state_dict["state"][param_id].items())
                    for k, v in params:
                        results.append((k, v.clone() if torch.is_tensor(v) else v))
            return results

        opt_params_list = [
            dict(lr=0.2, momentum=0.9, weight_decay=0.1, centered=True),
            dict(lr=0.2),
        ]
        for (_name, opt_class), opt_params in itertools.product(self.optimizers(), opt_params_list):
            model, optimizer = create_model(opt_class, opt_params)
            y_pred = model(x)
            loss = F.mse_loss(y_pred, y, reduction="sum")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

            model_param_values = get_model_param_values(model)
            for _, model_param_value in model_param_values:
                hvd.broadcast_(model_param_value, root_rank=0)

            opt_param_values_updated = []
            for name, opt_param_value in get_optimizer_param_values(optimizer):
                if torch.is_tensor(opt_param_value):
                    hvd.broadcast_(opt_param_value, root_rank=0)
                else:
                    opt_param_value = hvd.broadcast_object(opt_param_value, name=name)
                opt_param_values_updated.append((name, opt_param_value))
            opt_param_values = opt_param_values_updated

            with tempfile.TemporaryDirectory() as folder:
                fname = os.path.join(folder, "state.pt")
                if hvd.rank() == 0:
                    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                    torch.save(state, fname)
                model, optimizer = create_model(opt_class, opt_params)
                if hvd.rank() == 0:
                    checkpoint = torch.load(fname)
                    model.load_state_dict(checkpoint["model"])
                    optimizer.load_state_dict(checkpoint["optimizer"])

            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            model_param_value_after = get_model_param_values(model)
            for before, after in zip(model_param_values, model_param_value_after, strict=True):
                self.assertEqual(before[0], after[0])
                self.assertTrue((before[1] == after[1]).all())

            expected_tensors = hvd.broadcast_object(len(optimizer.state_dict()["state"].values()))
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
            self.assertEqual(len(optimizer.state_dict()["state"].values()), expected_tensors)

            opt_param_values_after = get_optimizer_param_values(optimizer)
            for before, after in zip(opt_param_values, opt_param_values_after, strict=True):
                name, opt_param_value = before
                name_after, opt_param_value_after = after
                self.assertEqual(name, name_after)
                self.assertEqual(type(opt_param_value), type(opt_param_value_after))
                if torch.is_tensor(opt_param_value):
                    self.assertTrue((opt_param_value == opt_param_value_after).all())
                else:
                    self.assertEqual(opt_param_value, opt_param_value_after)

    def test_broadcast_state_options(self):
        hvd.init()
        N, D_in, H, D_out = 64, 100, 10, 10
        x = torch.randn(N, D_in).requires_grad_()
        y = torch.randn(N, D_out).requires_grad_()
        params_0 = dict(lr=0.1, momentum=0.8, weight_decay=0.2, nesterov=True, betas=(0.9, 0.999))
        params_1 = dict(lr=0.2, momentum=0.9, weight_decay=0.1, nesterov=False, betas=(0.8, 0.9))
        for opt_class in [torch.optim.SGD, torch.optim.Adam]:
            model = torch.nn.Sequential(
                torch.nn.Linear(D_in, H), torch.nn.ReLU(), torch.nn.Linear(H, D_out)
            )
            params = params_0 if hvd.rank() == 0 else params_1
            p = {
                k: v
                for k, v in params.items()
                if k in inspect.signature(opt_class.__init__).parameters
            }
            opt = opt_class(model.parameters(), **p)
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
            hvd.broadcast_optimizer_state(opt, root_rank=0)
            p0 = {
                k: v
                for k, v in params_0.items()
                if k in inspect.signature(opt_class.__init__).parameters
            }
            for k, p in p0.items():
                p_actual = opt.param_groups[0][k]
                if not isinstance(p, Iterable):
                    p_actual = [p_actual]
                    p = [p]
                for i in range(len(p)):
                    self.assertEqual(type(p_actual[i]), type(p[i]))
                    self.assertAlmostEqual(p_actual[i], p[i], delta=1e-5)
            # Ensure that the parameter option types are compatible with ops.
            y_pred = model(x)
            loss = F.mse_loss(y_pred, y, reduction="sum")
            opt.zero_grad()
            loss.backward()
            opt.step()

    def test_broadcast_state_no_grad(self):
        class ModelNoGrad(nn.Module):
            def __init__(self, a, b):
                super().__init__()
                self.a = nn.Parameter(a.int(), requires_grad=False)
                self.b = nn.Parameter(b)

            def forward(self, x):
                return torch.index_select(self.b, 0, self.a.long()) * x

        hvd.init()
        a = torch.Tensor([1, 3])
        b = torch.rand(4)
        model = ModelNoGrad(a, b)
        optimizer = torch.optim.SGD(
            model.parameters(), lr=0.001, weight_decay=1e-6, momentum=0.9, nesterov=True
        )
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        grad = optimizer.param_groups[0]["params"][1].grad
        bgrad = hvd.broadcast(grad, root_rank=0)
        assert optimizer.param_groups[0]["params"][0].grad is None
        assert torch.all(torch.eq(grad, bgrad)).item()

    def test_force_allreduce(self):
        """Parameters unused on one rank are reduced all the same in step()."""
        hvd.init()
        rank = hvd.rank()
        if hvd.size() == 1:
            self.skipTest("Only one worker available")
        N, D_in, H, D_out = 64, 100, 10, 10
        x = torch.randn(N, D_in).requires_grad_()
        y = torch.randn(N, D_out).requires_grad_()

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1 = torch.nn.Linear(D_in, H)
                self.fc2 = torch.nn.Linear(H, D_out)
                self.fc3 = torch.nn.Linear(D_out, D_out)

            def forward(self, x_):
                x_ = F.relu(self.fc1(x_))
                x1_ = self.fc2(x_)
                x2_ = self.fc3(F.relu(x1_))
                return x1_, x2_

        opt_params_list = [
            dict(lr=0.2, momentum=0.9, weight_decay=0.1, centered=True),
            dict(lr=0.2),
        ]
        for (_n, opt_class), opt_params in itertools.product(self.optimizers(), opt_params_list):
            model = Net()
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            opt = self.new_optimizer(opt_class, opt_params, model)
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
            y_pred1, y_pred2 = model(x)
            if rank == 0:
                loss = F.mse_loss(y_pred1, y, reduction="sum")
            else:
                loss = F.mse_loss(y_pred2, y, reduction="sum")
            opt.zero_grad()
            loss.backward()
            opt.step()

    def test_dynamic_requires_grad(self):
        hvd.init()
        if hvd.size() == 1:
            self.skipTest("Only one worker available")
        gen = torch.nn.Conv2d(1, 10, 1)
        disc = torch.nn.Conv2d(10, 1, 1)
        inp = torch.rand([1, 1, 100, 100])
        gen_opt = hvd.DistributedOptimizer(
            torch.optim.SGD(gen.parameters(), lr=0.1), named_parameters=gen.named_parameters()
        )
        disc_opt = hvd.DistributedOptimizer(
            torch.optim.SGD(disc.parameters(), lr=0.1), named_parameters=disc.named_parameters()
        )

        def train_step(train_generator=False, train_discriminator=False):
            for p in gen.parameters():
                p.requires_grad_(train_generator)
            for p in disc.parameters():
                p.requires_grad_(train_discriminator)
            gen_opt.zero_grad()
            disc_opt.zero_grad()
            loss = disc(gen(inp)).sum()
            loss.backward()
            for p in gen.parameters():
                assert train_generator == (p.grad is not None and p.grad.max().is_nonzero())
            for p in disc.parameters():
                assert train_discriminator == (p.grad is not None and p.grad.max().is_nonzero())
            if train_generator:
                gen_opt.step()
            if train_discriminator:
                disc_opt.step()

        for _ in range(3):
            train_step(train_generator=True)
            train_step(train_discriminator=True)

    def test_gradient_clipping(self):
        hvd.init()
        x = torch.ones(1, 1).requires_grad_()
        y = torch.ones(1, 1).requires_grad_()
        model = torch.nn.Linear(1, 1)
        model.weight = torch.nn.Parameter(torch.zeros(1, 1) + 0.5)
        model.bias = torch.nn.Parameter(torch.zeros(1))
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        y_pred = model(x)
        loss = F.mse_loss(y_pred, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.synchronize()
        prior_grad = model.weight.grad.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        clipped_grad = model.weight.grad.item()
        assert abs(prior_grad) > abs(clipped_grad)
        with optimizer.skip_synchronize():
            optimizer.step()

    def test_synchronize_step_warning(self):
        hvd.init()
        if hvd.size() == 1:
            self.skipTest("Only one worker available")
        x = torch.zeros(1, 1).requires_grad_()
        y = torch.ones(1, 1).requires_grad_()
        model = torch.nn.Linear(1, 1)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        y_pred = model(x)
        loss = F.mse_loss(y_pred, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.synchronize()
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            optimizer.step()
            self.assertEqual(len(ws), 1)
            self.assertTrue(
                "optimizer.step() called without optimizer.skip_synchronize()" in str(ws[0].message)
            )

    def test_duplicate_names(self):
        """Duplicate names fail (no hvd.init() here: it runs on the previous test's init)."""
        net1 = torch.nn.Conv2d(1, 1, 1)
        net2 = torch.nn.Conv2d(1, 1, 1)
        parameters = itertools.chain(net1.parameters(), net2.parameters())
        opt = torch.optim.SGD(parameters, lr=0.1)
        named_parameters = itertools.chain(net1.named_parameters(), net2.named_parameters())
        try:
            hvd.DistributedOptimizer(opt, named_parameters=named_parameters)
            raise AssertionError("hvd.DistributedOptimizer did not throw error")
        except ValueError:
            pass

    def test_missing_named_parameters(self):
        hvd.init()
        net = torch.nn.Conv2d(1, 1, 1)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        try:
            hvd.DistributedOptimizer(opt, named_parameters=[("weight", net.weight)])
            raise AssertionError("hvd.DistributedOptimizer did not throw error")
        except ValueError:
            pass

    def test_optimizer_no_named_parameters(self):
        hvd.init()
        model = nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10))
        optimizer = torch.optim.SGD(
            [{"params": model[0].parameters()}, {"params": model[1].parameters()}], lr=0.001
        )
        optimizer = hvd.DistributedOptimizer(optimizer)
        params = optimizer._parameter_names
        self.assertEqual(len(params), len(set(params.values())))
        all_param_names = hvd.allgather_object(set(params.values()))
        self.assertEqual(len(all_param_names), hvd.size())
        for param_names in all_param_names:
            self.assertEqual(all_param_names[0], param_names)
        # And it trains.
        model(torch.ones(4, 10)).sum().backward()
        optimizer.step()
