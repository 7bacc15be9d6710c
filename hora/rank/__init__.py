"""A rank's side of a job, the twin of `hora.job` (the driver's side).

- `worker`: `python -m hora.rank.worker`, the bootstrap every rank runs, whatever engine started
  it: find the driver, run the engine's rank-side setup, run the job, send back its end.
- `stacks`: where this rank is (every thread's stack, the collectives in flight), for a driver
  that asks a hung job.

Importing this package imports nothing: a rank's process pays only for what it runs.
"""
