"""save/load for TorchEstimator and TorchModel, both ways pyspark saves a stage.

pyspark.ml's (MLWritable/MLReadable: `write().save(path)`, `load(path)`, a `pyspark.ml`
PipelineModel holding the stage), on classic and Spark Connect sessions:

    <path>/metadata/       pyspark's own params metadata (DefaultParamsWriter): the class, uid and
                           every JSON-able param (store and run_id included, which Horovod's
                           estimator forgot), so a PipelineModel holding a TorchModel loads
    <path>/objects.pkl     cloudpickle of the params that are Python objects: model, optimizer,
                           loss, metrics, callbacks, history

The metadata goes through Spark (the SparkContext of a classic session; the SparkSession's
DataFrame writer on Connect, pyspark >= 4.0), objects.pkl through pyarrow on the driver: the path
is a local path, a `file:` URI or any URI pyarrow opens, as the store, and the driver and the
cluster must both reach it.

pyspark.ml.connect's (`StageFile`: `saveToLocal`/`loadFromLocal`, and its Pipeline's), where the
JSON-able params go into the pipeline's metadata.json and the Python objects into one file per
stage beside it, `<stage>.<class>.objects.pkl`.
"""

from __future__ import annotations

import importlib
from typing import Any

import cloudpickle
import pyspark
from pyspark.ml.param import Params
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReader, MLWriter

from hora.engines.spark import ClassicSession, ConnectSession, active_session
from hora.storage import Location

OBJECTS_FILE = "objects.pkl"  # the params that are Python objects (model, optimizer, ...)


def object_params(instance: Params, names: tuple[str, ...]) -> dict[str, Any]:
    """The values of the params `names` that are set or have a default."""
    return {n: instance.getOrDefault(n) for n in names if instance.isDefined(instance.getParam(n))}


class HoraWriter(MLWriter):
    def __init__(self, instance: Any) -> None:
        super().__init__()
        self._instance = instance
        self._objects: tuple[str, ...] = instance.stage_objects

    def save(self, path: str) -> None:
        folder = Location.parse(path, "path")
        if folder.exists():
            if not self.shouldOverwrite:
                raise FileExistsError(
                    f"{path!r} already exists; use .write().overwrite().save(path) to replace it"
                )
            folder.remove_tree()
        self.saveImpl(path)

    def saveImpl(self, path: str) -> None:
        folder = Location.parse(path, "path")
        instance = self._instance
        values = {
            p.name: instance.getOrDefault(p) for p in instance.params if instance.isDefined(p)
        }
        plain = {k: v for k, v in values.items() if k not in self._objects}
        DefaultParamsWriter.saveMetadata(instance, path, _metadata_session(), paramMap=plain)
        objects = object_params(instance, self._objects)
        folder.write_bytes(OBJECTS_FILE, cloudpickle.dumps(objects))


class HoraReader(MLReader):
    def __init__(self, cls: type) -> None:
        super().__init__()
        self._cls = cls

    def load(self, path: str) -> Any:
        folder = Location.parse(path, "path")
        if not folder.exists(OBJECTS_FILE):
            raise FileNotFoundError(f"{path!r} holds no saved hora estimator or model")
        metadata = DefaultParamsReader.loadMetadata(path, _metadata_session())
        module, _, name = metadata["class"].rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        if not issubclass(cls, self._cls):
            raise TypeError(f"{path!r} holds a {name}, not a {self._cls.__name__}")
        objects = cloudpickle.loads(folder.read_bytes(OBJECTS_FILE))
        instance = cls()
        instance._resetUid(metadata["uid"])
        instance._set(**metadata["paramMap"], **objects)
        return instance


def _metadata_session() -> Any:
    """What DefaultParamsWriter/Reader write the metadata through: a classic session's
    SparkContext (what pyspark 3.5 takes), a Connect session's SparkSession (pyspark >= 4.0)."""
    found = active_session()
    if isinstance(found, ClassicSession):
        return found.sc
    if not isinstance(found, ConnectSession):
        raise RuntimeError("saving or loading a Spark ML stage needs an active SparkSession")
    if int(pyspark.__version__.split(".")[0]) < 4:
        raise RuntimeError(
            f"saving or loading a Spark ML stage from a Spark Connect client needs pyspark 4.0 or "
            f"later (this is {pyspark.__version__}): pip install 'pyspark[connect]>=4.0'"
        )
    return found.spark


class StageFile(Params):
    """pyspark.ml.connect's persistence hooks (its ParamsReadWrite and CoreModelReadWrite call
    them): the params named in `stage_objects` are left out of the JSON metadata and cloudpickled
    into the stage's one file."""

    stage_objects: tuple[str, ...] = ()

    def _get_skip_saving_params(self) -> list[str]:
        # Params set to None too: loading passes each saved value through the param's type
        # converter, which refuses None for a list; their defaults are None anyway.
        nones = [p.name for p, value in self._paramMap.items() if value is None]
        return [*self.stage_objects, *nones]

    def _get_core_model_filename(self) -> str:
        return f"{type(self).__name__}.objects.pkl"

    def _save_core_model(self, path: str) -> None:
        with open(path, "wb") as f:
            f.write(cloudpickle.dumps(object_params(self, self.stage_objects)))

    def _load_core_model(self, path: str) -> None:
        with open(path, "rb") as f:
            self._set(**cloudpickle.loads(f.read()))
