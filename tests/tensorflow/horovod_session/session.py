"""Run the Horovod-style TensorFlow and Keras suites inside a rank, as
`horovodrun -np N pytest test_tensorflow.py test_tensorflow2_keras.py` does: one pytest session
per rank, every test one after another in one process.

TensorFlow's import costs seconds per process, so one hora job per world size (`run_job`) runs
both what tests/tensorflow asks of a rank: the conformance cases, then this session.
"""

from __future__ import annotations

import os
from typing import Any

from tests.torch.horovod_session.session import run_pytest

HERE = os.path.dirname(__file__)
SUITES = [
    os.path.join(HERE, "horovod_tensorflow_suite.py"),
    os.path.join(HERE, "horovod_keras_suite.py"),
]
#: One world size (the suite's budget: each job is 3 TensorFlow imports and both suites, about 40 s
#: on 2 cores): 3 ranks, so that the even and odd ranks' process sets differ in size and an
#: allgather's blocks are uneven; hora's engine at 2 ranks is tests/collectives'.
SIZES = (3,)
ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "HOROVOD_DYNAMIC_PROCESS_SETS": "1",  # the suites add and remove process sets
    "HOROVOD_TIMELINE": "DYNAMIC",  # for start_timeline / stop_timeline
}


def run_session(*selection: str) -> dict[str, Any]:
    """Run both suites (or a `-k`-style selection) in this rank; never raises."""
    return run_pytest(SUITES, *selection)


def run_job() -> dict[str, Any]:
    """A rank's whole part: {"cases": the conformance cases' outcomes, "session": the suites'}."""
    from tests.tensorflow import _cases  # imports TensorFlow: in the ranks, not the driver

    return {"cases": _cases.run_all(), "session": run_session()}
