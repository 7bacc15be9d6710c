"""save/load for TorchEstimator and TorchModel (pyspark's MLWritable/MLReadable):

    <path>/metadata.json   the class, uid and every JSON-able param (store and run_id included,
                           which Horovod's estimator forgot)
    <path>/objects.pkl     cloudpickle of the params that are Python objects: model, optimizer,
                           loss, metrics, callbacks, history

The path is a local path, a `file:` URI or any URI pyarrow opens, as the store.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

import cloudpickle
from pyspark.ml.util import MLReader, MLWriter

from hora.spark.estimator.store import Store


class HoraWriter(MLWriter):
    def __init__(self, instance: Any, objects: tuple[str, ...]) -> None:
        super().__init__()
        self._instance = instance
        self._objects = objects

    def save(self, path: str) -> None:
        store = Store.parse(path)
        if store.exists(store.path("metadata.json")) or store.exists(store.root):
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
        cls = type(instance)
        metadata = {
            "class": f"{cls.__module__}.{cls.__qualname__}",
            "uid": instance.uid,
            "params": plain,
        }
        store.write_bytes(store.path("objects.pkl"), cloudpickle.dumps(objects))
        store.write_bytes(store.path("metadata.json"), json.dumps(metadata, indent=1).encode())


class HoraReader(MLReader):
    def __init__(self, cls: type) -> None:
        super().__init__()
        self._cls = cls

    def load(self, path: str) -> Any:
        store = Store.parse(path)
        metadata_path = store.path("metadata.json")
        if not store.exists(metadata_path):
            raise FileNotFoundError(f"{path!r} holds no saved hora estimator or model")
        metadata = json.loads(store.read_bytes(metadata_path))
        module, _, name = metadata["class"].rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        if not issubclass(cls, self._cls):
            raise TypeError(f"{path!r} holds a {name}, not a {self._cls.__name__}")
        objects = cloudpickle.loads(store.read_bytes(store.path("objects.pkl")))
        instance = cls()
        instance._resetUid(metadata["uid"])
        instance._set(**metadata["params"], **objects)
        return instance
