"""How `TorchModel.transform` gets the pickled model to the executors' Python workers.

- classic session: a broadcast variable, sent once per executor (as before);
- Spark Connect, up to `CLOSURE_LIMIT` pickled: inside mapInArrow's function, as the models of
  pyspark.ml.connect ship theirs. A Connect client has no SparkContext, so no broadcast; the
  closure travels in the plan of every query, and a task that unpickles a large one runs out
  of heap (60 MB did on a 1 GiB local[2]; a plan over 128 MiB is refused by gRPC);
- Spark Connect, larger: an artifact file of the session (`addArtifacts(path, file=True)`,
  uploaded in chunks once per model and session), read in the tasks with `SparkFiles.get`.

Each way is a small picklable value with a `token` (which model it is, for the workers' cache)
and `payload()` (the pickled model, called in the task).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any

CLOSURE_LIMIT = 8 << 20  # bytes of pickled model that may ride in the query plan

_UPLOADED: set[tuple[str, str]] = set()  # (Connect session id, artifact name) already added


@dataclass(frozen=True)
class Broadcast:
    variable: Any  # pyspark.Broadcast of the pickled model
    token: str

    def payload(self) -> bytes:
        return bytes(self.variable.value)


@dataclass(frozen=True)
class Inline:
    blob: bytes
    token: str

    def payload(self) -> bytes:
        return self.blob


@dataclass(frozen=True)
class Artifact:
    name: str  # the file's name among the session's artifacts
    token: str

    def payload(self) -> bytes:
        from pyspark import SparkFiles

        with open(SparkFiles.get(self.name), "rb") as f:
            return f.read()


Shipped = Broadcast | Inline | Artifact


def is_connect(spark: Any) -> bool:
    """Whether `spark` (a DataFrame's sparkSession) is a Spark Connect client's session."""
    return type(spark).__module__.startswith("pyspark.sql.connect.")


def ship(spark: Any, blob: bytes, limit: int = CLOSURE_LIMIT) -> Shipped:
    """The way `blob` (a pickled model) reaches the tasks of `spark`'s queries."""
    if not is_connect(spark):
        return Broadcast(spark.sparkContext.broadcast(blob), uuid.uuid4().hex)
    digest = hashlib.sha1(blob).hexdigest()
    if len(blob) <= limit:
        return Inline(blob, digest)
    name = f"hora-model-{digest}.pkl"
    if (spark.session_id, name) not in _UPLOADED:
        with tempfile.TemporaryDirectory(prefix="hora-model-") as folder:
            path = os.path.join(folder, name)
            with open(path, "wb") as f:
                f.write(blob)
            spark.addArtifacts(path, file=True)
        _UPLOADED.add((spark.session_id, name))
    return Artifact(name, digest)
