"""save/load for TorchEstimator and TorchModel (pyspark's MLWritable/MLReadable):

    <path>/metadata/       pyspark's own params metadata (DefaultParamsWriter): the class, uid and
                           every JSON-able param (store and run_id included, which Horovod's
                           estimator forgot), so a PipelineModel holding a TorchModel loads
    <path>/objects.pkl     cloudpickle of the params that are Python objects: model, optimizer,
                           loss, metrics, callbacks, history

The path is a local path, a `file:` URI or any URI pyarrow opens, as the store.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import cloudpickle
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReader, MLWriter

from hora.spark.estimator.store import Store

if TYPE_CHECKING:
    from pyspark import SparkContext


class HoraWriter(MLWriter):
    def __init__(self, instance: Any, objects: tuple[str, ...]) -> None:
        super().__init__()
        self._instance = instance
        self._objects = objects

    def save(self, path: str) -> None:
        store = Store.parse(path)
        if store.exists(store.root):
            if not self.shouldOverwrite:
                raise FileExistsError(
                    f"{path!r} already exists; use .write().overwrite().save(path) to replace it"
                )
            store.delete_dir(store.root)
        self.saveImpl(path)

    def saveImpl(self, path: str) -> None:
        store = Store.parse(path)
        instance = self._instance
        values = {
            p.name: instance.getOrDefault(p) for p in instance.params if instance.isDefined(p)
        }
        objects = {k: v for k, v in values.items() if k in self._objects}
        plain = {k: v for k, v in values.items() if k not in self._objects}
        DefaultParamsWriter.saveMetadata(instance, path, _spark_context(), paramMap=plain)
        store.write_bytes(store.path("objects.pkl"), cloudpickle.dumps(objects))


class HoraReader(MLReader):
    def __init__(self, cls: type) -> None:
        super().__init__()
        self._cls = cls

    def load(self, path: str) -> Any:
        store = Store.parse(path)
        if not store.exists(store.path("objects.pkl")):
            raise FileNotFoundError(f"{path!r} holds no saved hora estimator or model")
        metadata = DefaultParamsReader.loadMetadata(path, _spark_context())
        module, _, name = metadata["class"].rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        if not issubclass(cls, self._cls):
            raise TypeError(f"{path!r} holds a {name}, not a {self._cls.__name__}")
        objects = cloudpickle.loads(store.read_bytes(store.path("objects.pkl")))
        instance = cls()
        instance._resetUid(metadata["uid"])
        instance._set(**metadata["paramMap"], **objects)
        return instance


def _spark_context() -> SparkContext:
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None:
        raise RuntimeError("saving or loading a Spark ML stage needs an active SparkSession")
    return context
