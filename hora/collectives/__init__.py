"""hora's collective engine, shared by every framework API (hora.torch, hora.tensorflow).

One engine per process, whichever framework calls it: requests are negotiated by name with the
other ranks (`_negotiation`), fused and run on torch.distributed's gloo/NCCL groups and shared
memory (`_execute`, `_shm`) by a background thread (`_engine`). The engine moves torch tensors;
other frameworks hand it their data as torch views of the same memory (numpy -> `torch.from_numpy`).

Layers, bottom up (no module imports one above it):
  _common, _dtypes, _negotiation, _channel, _shm, _stall, _execute, _engine, _state
  _process_sets   process sets and their backend groups
  ops             request building: the async, in-place and grouped collectives, synchronize
  _basics         init/shutdown, ranks and sizes, dynamic process sets (uses ops.barrier)
Framework layers (hora.torch, hora.tensorflow) sit on top and add gradients and their tensor types.
"""

from hora.collectives._basics import *  # noqa: F403 - listed in _basics.__all__
from hora.collectives._basics import __all__ as _basics_all
from hora.collectives.ops import *  # noqa: F403 - listed in ops.__all__
from hora.collectives.ops import __all__ as _ops_all

__all__ = [*_basics_all, *_ops_all]
