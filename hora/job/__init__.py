"""The driver's job lifecycle, in parts that can be read and tested apart.

- `protocol`: every message between driver, launchers and workers, typed.
- `group`: one attempt's ranks on one engine (start, their messages, stop).
- `monitor`: watches one attempt: hands out the job, relays logs, collects results, tells the
  story of a failure.
- `policy`: decides whether a failed attempt is restarted or fails the run.
- `driver`: the restart loop that ties them together.

This package imports nothing at import time: workers import `hora.job.protocol` and must stay
light.
"""
