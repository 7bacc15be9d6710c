"""The driver's job lifecycle, in parts that can be read and tested apart.

- `launch`: the one entry every door calls: a validated `RunConfig` and a function in, every
  rank's value out.
- `group`: one attempt's ranks on one engine (start, their messages, stop).
- `monitor`: watches one attempt: hands out the job, relays logs, collects results, tells the
  story of a failure; `hearing` takes each message into `records`, one per process.
- `outcome`: how an attempt ended, as a value.
- `controller`: the run's decisions between attempts (with `policy`'s restart rule).
- `world`: the decisions within an elastic attempt (who its ranks are); `in_place` carries
  them out.
- `driver`: carries the decisions out, attempt after attempt.

The messages they exchange with launchers and workers are in `hora.wire.protocol`.
"""

from hora.job.launch import launch as launch
from hora.job.launch import launch_with_metrics as launch_with_metrics

__all__ = ["launch", "launch_with_metrics"]
