"""The bottom floor: how hora's processes talk, and nothing else of hora.

- `channel`: one framing, handshake and allow-list for every TCP star (the driver's job channel,
  the collectives' negotiation star).
- `protocol`: every message between driver, launchers, supervisors and workers, and the typed
  `Boot` line a worker reads on stdin.
- `link`: a worker's `DriverLink` (log_to_driver, hora's own reports, derived keys); what an
  elastic run's rank hears of its world and says of it is `hora.elastic`'s.

Nothing here imports anything of hora outside this package, nor anything beyond the standard
library: workers and Spark's Python workers import it before anything else.
"""
