"""The data room of hora.collectives: how an agreed bucket's bytes move between ranks.

Horovod's `ops/*_operations.cc` and `fusion_buffer_manager.cc`: `execute.run_bucket` runs a
bucket with its kind's algorithm (`algorithms/`: one module per op, its `run` and its `SPEC`,
found by `registry`), which packs it (`fusion`, `dtypes`) and moves it through a transport
(`transports`: gloo, NCCL, shared memory within a host (`shm`), the hierarchical path across
hosts (`hierarchy`)). It knows nothing of negotiation: it never
imports the control room (`hora.collectives._control`); both speak `hora.collectives._messages`.
"""
