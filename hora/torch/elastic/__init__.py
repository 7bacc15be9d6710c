"""`hvd.elastic`: training that survives failed collectives, lost hosts and resizes.

A collective that fails while every process lives (`HorovodInternalError`) is healed in place:
state goes back to its last `commit()`, `shutdown()` + `init()`, re-sync, and the function is
called again. Under a hora run every commit is also kept on each host, outside the ranks, so a
lost process or host costs only the steps since the last commit: the driver starts the ranks
again (an elastic run, `min_np`/`max_np`, with as many as the cluster can run now) and they
resume from the freshest commit found on any of their hosts. When slots return, every rank
stops at the same commit (`HostsUpdatedInterrupt`) and the run restarts larger from it.
See `hora.collectives.elastic`.
"""

from hora.collectives.elastic import HostsUpdatedInterrupt as HostsUpdatedInterrupt
from hora.torch.elastic._retry import run as run
from hora.torch.elastic.sampler import ElasticSampler as ElasticSampler
from hora.torch.elastic.state import ObjectState as ObjectState
from hora.torch.elastic.state import State as State
from hora.torch.elastic.state import TorchState as TorchState

__all__ = [
    "ElasticSampler",
    "HostsUpdatedInterrupt",
    "ObjectState",
    "State",
    "TorchState",
    "run",
]
