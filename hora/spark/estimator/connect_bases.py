"""The base classes that make TorchEstimator and TorchModel `pyspark.ml.connect` stages too.

`pyspark.ml.connect.Pipeline` takes only instances of its own Estimator/Transformer classes,
which are not `pyspark.ml`'s: the stages inherit both. Where their methods share a name, the
`pyspark.ml` ones come first (`fit`, `transform`, `save`, `load`, `write`, `read`) and accept
what the `pyspark.ml.connect` ones do; a `pyspark.ml.connect` pipeline saves its stages through
other names (persistence.StageFile). Importing pyspark.ml.connect checks Spark Connect's client
libraries (grpcio & co., pyspark's `connect` extra): without them the bases here are plain
Params, and only `pyspark.ml` pipelines take the stages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.ml.param import Params

try:
    from pyspark.ml.connect import base as _connect
    from pyspark.ml.connect.io_utils import CoreModelReadWrite, ParamsReadWrite

    AVAILABLE = True
except ImportError:
    AVAILABLE = False

if TYPE_CHECKING or AVAILABLE:

    class ConnectEstimator(_connect.Estimator[Any], ParamsReadWrite, CoreModelReadWrite):
        """pyspark.ml.connect's Estimator, saved as its pipelines save their stages."""

    class ConnectModel(_connect.Model, ParamsReadWrite, CoreModelReadWrite):
        """pyspark.ml.connect's Model, saved as its pipelines save their stages."""

else:

    class ConnectEstimator(Params):
        """Stands in for pyspark.ml.connect's Estimator where it cannot be imported."""

    class ConnectModel(Params):
        """Stands in for pyspark.ml.connect's Model where it cannot be imported."""
