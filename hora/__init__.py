"""hora: run a single-machine training function on N processes, locally or on Apache Spark.

`hora.Runner(np).run(main, **kwargs)` is HorovodRunner's contract, `hora.run(fn, ...)` is
horovod.run's, `hora.torch` is Horovod's PyTorch API on torch.distributed, `hora.Checkpoint`
(from hora.checkpoint) writes and finds training checkpoints, `hora.report(metrics)` sends a
step's metrics from any rank to the driver (printed, and to `report_to=`'s `hora.reporters`).
`@hora.distributed(gpus=N, remote=...)` is Databricks' serverless GPU API (`serverless_gpu`).
"""

import importlib
import importlib.util
from types import ModuleType

from hora import reporters as reporters
from hora._version import __version__ as __version__
from hora.api import HorovodRunner as HorovodRunner
from hora.api import Runner as Runner
from hora.api import run as run
from hora.checkpoint import Checkpoint as Checkpoint
from hora.errors import HoraError as HoraError
from hora.errors import RunTimeoutError as RunTimeoutError
from hora.errors import UnpicklableError as UnpicklableError
from hora.errors import WorkerFailedError as WorkerFailedError
from hora.serverless import distributed as distributed
from hora.wire.link import log_to_driver as log_to_driver
from hora.wire.link import report as report


def __getattr__(name: str) -> ModuleType:
    """`hora.data`, `hora.spark`, ... after a plain `import hora` (as `ray.data` or
    `torch.distributed`), imported on first use: `import hora` stays free of torch and pyarrow."""
    if not name.startswith("_") and importlib.util.find_spec(f"hora.{name}") is not None:
        return importlib.import_module(f"hora.{name}")
    raise AttributeError(f"module 'hora' has no attribute {name!r}")


__all__ = [
    "Checkpoint",
    "HoraError",
    "HorovodRunner",
    "RunTimeoutError",
    "Runner",
    "UnpicklableError",
    "WorkerFailedError",
    "distributed",
    "log_to_driver",
    "report",
    "reporters",
    "run",
]
