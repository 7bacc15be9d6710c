"""hora.checkpoint: training state written atomically by rank 0 and found again after a failure.

```python
ckpt = hora.checkpoint.Checkpoint("/shared/run1/checkpoints", keep=3)
found = ckpt.load_and_broadcast()          # every rank gets rank 0's newest whole checkpoint
start = found.step + 1 if found else 0
...
ckpt.save({"model": model.state_dict(), "optimizer": opt.state_dict(), ...}, step)
```

A file: torch.save's bytes plus a footer (length, CRC-32); see `_format`. Where files go: a
local or mounted directory, or a pyarrow filesystem; see `_storage`.
"""

from hora.checkpoint._checkpoint import Checkpoint as Checkpoint
from hora.checkpoint._checkpoint import CheckpointLoadError as CheckpointLoadError
from hora.checkpoint._checkpoint import Restored as Restored

__all__ = ["Checkpoint", "CheckpointLoadError", "Restored"]
