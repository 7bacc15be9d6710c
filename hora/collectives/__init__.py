"""hora's collective engine, shared by every framework API (hora.torch, hora.tensorflow).

One engine per process, whichever framework calls it: requests are negotiated by name with the
other ranks, fused and run on torch.distributed's gloo/NCCL groups and shared memory by a
background thread. The engine moves torch tensors; other frameworks hand it their data as torch
views of the same memory (numpy -> `torch.from_numpy`). Each module names the Horovod file it
stands for where there is one.

Two rooms under one front door, after Horovod's core (tests/test_layout.py keeps the arrows
pointing down: front -> control -> data -> the shared words):
  _common, _messages   the shared words: ops and errors; every message of the engine, typed
  _data/               the data room: how an agreed bucket's bytes move. `groups` (a process set
                       as the data path sees it), `transports` (gloo/NCCL routing, shared
                       memory and the hierarchical path: `shm`, `hierarchy`), `fusion`,
                       `dtypes`, one module per operation (`algorithms/`), `execute.run_bucket`;
                       it never imports the control room
  _control/            the control room: which collective runs when. `state`, `process_sets`,
                       `requests`, `sparse`, `submissions` (the caller's side), `loop` (the
                       `CollectiveLoop` thread and its drive lock), `worker_round`,
                       `coordinator_round`, `responses`, rank 0's `negotiation`, `validation`,
                       `planning`, `cache`, `stall`, and the star's `channel`
  framework            each collective's request with every argument explicit (`submit_*`), and
                       what else a framework API builds on (op resolution, names, errors)
  ops                  Horovod's async, in-place and grouped collectives, synchronize
  _basics              init/shutdown (wires the two rooms), ranks and sizes, dynamic process sets
  objects, elastic     Python objects across ranks; what every framework's `hvd.elastic` uses
Framework layers (hora.torch, hora.tensorflow) sit on top and add gradients and their tensor types;
their public face here is this package's `__all__` (Horovod's calls), `framework` and `objects`.
"""

# ruff: noqa: F405 - the names of __all__ come from the star imports
from hora.collectives._basics import *  # noqa: F403 - listed in _basics.__all__
from hora.collectives._control.state import in_flight as in_flight  # not Horovod's: not in __all__
from hora.collectives.ops import *  # noqa: F403 - listed in ops.__all__

# Listed name by name, not computed from the lists of the modules star-imported above, so that
# type checkers see the surface; tests/test_public_names.py checks that it is still their union.
__all__ = [
    "NOT_INITIALIZED",
    "Adasum",
    "Average",
    "HorovodInternalError",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "add_process_set",
    "allgather_async",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall_async",
    "barrier",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather_async",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter_async",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "reducescatter_async",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "sparse_allreduce_async",
    "synchronize",
]
