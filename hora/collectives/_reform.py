"""A world re-formed in place: the survivors of a lost rank become a smaller world, or the running
ranks and new ones a larger one, in the same processes (Horovod's elastic reset).

The driver tells each running rank its new coordinates (`Reform`). Here a running rank stops its
loop, writes the new coordinates and the world's generation into its environment (where
`init()` and the user's code read them), makes a new default group through the launcher's store
under the generation's prefix (`_rendezvous`: the old world's keys stay in the store, and must
not be read again; new ranks wait there until a running rank opens it), and starts the collective
loop anew: new process groups, negotiation tree and shared memory.
"""

from __future__ import annotations

from hora import environment
from hora.collectives import _rendezvous
from hora.collectives._basics import init, replace_default_group, shutdown, timeout
from hora.wire.protocol import Reform


def reform(order: Reform) -> int:
    """Make this process the rank `order.place` says, in place; where the driver orders a
    newer world while this one gathers (a rank of it was lost), that one. Returns the
    generation of the world made."""
    shutdown()
    here = _rendezvous.take(order)
    replace_default_group(lambda: _rendezvous.init_default_group(here, timeout(), opening=True))
    init()
    return environment.current().generation
