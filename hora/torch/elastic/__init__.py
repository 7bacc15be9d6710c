"""`hvd.elastic`: keep training through a failed collective by rolling back to the last commit.

What hora can and cannot recover: the world is fixed (hora's launchers do not add, remove or
respawn workers). `run` therefore recovers from errors that every live rank sees as a
`HorovodInternalError` while all processes survive (a mismatched or timed-out collective, a torn
connection): state goes back to its last `commit()`, the process group is rebuilt with
`shutdown()` + `init()`, state is re-broadcast from rank 0 and the function is retried. A worker
that died stays dead, and its in-memory state with it: the launcher fails the attempt, and with
`max_restarts` starts the whole group again, which then resumes from the last checkpoint on disk
(`hora.checkpoint`).
"""

from hora.torch.elastic._retry import run as run
from hora.torch.elastic.sampler import ElasticSampler as ElasticSampler
from hora.torch.elastic.state import ObjectState as ObjectState
from hora.torch.elastic.state import State as State
from hora.torch.elastic.state import TorchState as TorchState

__all__ = ["ElasticSampler", "ObjectState", "State", "TorchState", "run"]
