"""hora.data: Spark DataFrames (or Parquet, or Delta tables) into every door's training function,
streamed, sharded over the ranks, resumable mid-epoch and resharded when an elastic job changes
size.

```python
dataset = hora.data.from_spark(df)              # on the driver: Parquet, written once (or
                                                # read in place: a plain scan of Parquet)
def train():
    loader = dataset.loader(batch_size=64)      # in each rank: this rank's share
    for epoch in range(3):
        loader.set_epoch(epoch)
        for batch in loader:                    # {"features": tensor, "label": tensor}
            ...
```
See docs/data.md for the guarantees (each row once per epoch, resume, resize) and the limits.
"""

from hora.data._columns import ColumnError as ColumnError
from hora.data._dataset import Dataset as Dataset
from hora.data._dataset import EmptyDataError as EmptyDataError
from hora.data._dataset import from_parquet as from_parquet
from hora.data._delta import from_delta as from_delta
from hora.data._loader import DEFAULT_PREFETCH as DEFAULT_PREFETCH
from hora.data._loader import Loader as Loader
from hora.data._spark import STORE_CONF as STORE_CONF
from hora.data._spark import from_spark as from_spark
from hora.data._workers import MAX_DEFAULT_WORKERS as MAX_DEFAULT_WORKERS
from hora.data._workers import LoaderWorkerError as LoaderWorkerError

__all__ = [
    "DEFAULT_PREFETCH",
    "MAX_DEFAULT_WORKERS",
    "STORE_CONF",
    "ColumnError",
    "Dataset",
    "EmptyDataError",
    "Loader",
    "LoaderWorkerError",
    "from_delta",
    "from_parquet",
    "from_spark",
]
