"""hora.checkpoint: training state written atomically by rank 0 and found again after a failure.

```python
ckpt = hora.checkpoint.Checkpoint("/shared/run1/checkpoints", keep=3)
found = ckpt.load_and_broadcast()          # every rank gets rank 0's newest whole checkpoint
start = found.step + 1 if found else 0
...
ckpt.save({"model": model.state_dict(), "optimizer": opt.state_dict(), ...}, step)
```

A file: torch.save's bytes plus a footer (length, CRC-32); see `_format`. Where files go: a
local or mounted directory, or a pyarrow filesystem; see `hora.storage`. hvd.elastic's commits,
kept on each host so that they outlive the ranks: `_commits`.
"""

from hora.checkpoint._checkpoint import Checkpoint as Checkpoint
from hora.checkpoint._checkpoint import CheckpointLoadError as CheckpointLoadError
from hora.checkpoint._checkpoint import Restored as Restored
from hora.checkpoint._commits import Commit as Commit
from hora.checkpoint._commits import CommitStore as CommitStore
from hora.checkpoint._commits import remove_host_commits as remove_host_commits
from hora.checkpoint._commits import remove_stale_commits as remove_stale_commits

__all__ = [
    "Checkpoint",
    "CheckpointLoadError",
    "Commit",
    "CommitStore",
    "Restored",
    "remove_host_commits",
    "remove_stale_commits",
]
