"""Run the Horovod-style TensorFlow and Keras suites inside a rank, as
`horovodrun -np N pytest test_tensorflow.py test_tensorflow2_keras.py` does: one pytest session
per rank, every test one after another in one process (TensorFlow is imported once per rank)."""

from __future__ import annotations

import os
from typing import Any

from tests.torch.horovod_session.session import run_pytest

HERE = os.path.dirname(__file__)
SUITES = [
    os.path.join(HERE, "horovod_tensorflow_suite.py"),
    os.path.join(HERE, "horovod_keras_suite.py"),
]


def run_session(*selection: str) -> dict[str, Any]:
    """Run both suites (or a `-k`-style selection) in this rank; never raises."""
    return run_pytest(SUITES, *selection)
