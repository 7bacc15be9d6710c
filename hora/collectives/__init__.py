"""hora's collectives, shared by every framework API (hora.torch, hora.tensorflow).

One collective loop per process, whichever framework calls it: requests are negotiated by name
with the other ranks, fused and run through the transports (torch.distributed's gloo and NCCL
groups, shared memory) by a background thread. The loop moves torch tensors; other frameworks
hand it their data as torch views of the same memory (numpy -> `torch.from_numpy`). Each module
names the Horovod file it stands for where there is one.

Two rooms under one front door, after Horovod's core (tests/test_layout.py keeps the arrows
pointing down: front -> control -> data -> the shared words):
  _common, _messages   the shared words: ops and errors; every message of the loop, typed
  _data/               the data room: how an agreed bucket's bytes move. `groups` (a process set
                       as the data path sees it), `transports` (gloo/NCCL routing, shared
                       memory and the hierarchical path: `shm`, `hierarchy`), `fusion`,
                       `dtypes`, one module per op (`algorithms/`: its `run` and its `SPEC`, an
                       `op_spec.OpSpec`, found by `registry`), `execute.run_bucket`; it never
                       imports the control room
  _control/            the control room: which collective runs when. `state`, `process_sets`,
                       `requests`, `sparse`, `submissions` (the caller's side), `loop` (the
                       `CollectiveLoop` thread and its drive lock), `worker_round`,
                       `coordinator_round`, `responses`, rank 0's `negotiation`, `validation`,
                       `planning`, `cache`, `stall`, and the negotiation tree (`tree`, each
                       rank's `relay`, the sockets' `channel`)
  ops                  each op's face: its request with every argument explicit (`submit_*`),
                       Horovod's async, in-place and grouped forms; synchronize, join
  _forms               how `ops` makes those forms from one request per op, by their names
  framework            what else a framework API builds on (op resolution, errors, the names
                       each op has in each framework: `op_faces`)
  _basics              init/shutdown, ranks and sizes, dynamic process sets
  _start               the loop's start at init (wires the two rooms): its thread, the
                       negotiation tree and its key, the data path beyond gloo
  _driver              the one hook to a hora run's driver (its link, the rank's half of the
                       elastic talk: `hora.elastic`); no other module here imports either
  objects, elastic     Python objects across ranks; what every framework's `hvd.elastic` uses
  _commits             a hvd.elastic state's commits: their count, the host's store, the freshest
Framework layers (hora.torch, hora.tensorflow) sit on top and add gradients and their tensor types;
their public face here is this package's `__all__` (Horovod's calls), `ops`, `framework` and
`objects`.
"""

from typing import TYPE_CHECKING

from hora.collectives import _basics, ops
from hora.collectives._basics import *  # noqa: F403 - listed in _basics.__all__
from hora.collectives._control.state import in_flight as in_flight  # not Horovod's: not in __all__
from hora.collectives.ops import *  # noqa: F403 - listed in ops.__all__, each op's from its spec

# mypy reads no computed __all__ (it would export nothing); without one it sees every public name.
if not TYPE_CHECKING:
    __all__ = sorted({*_basics.__all__, *ops.__all__})
