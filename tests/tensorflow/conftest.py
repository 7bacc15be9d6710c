"""One hora job per world size (`session.SIZES`: 3 ranks) serves every test of tests/tensorflow
(TensorFlow's import costs seconds per process): each rank runs the conformance cases and the
Horovod-style session."""

from __future__ import annotations

from typing import Any

import pytest

import hora
from tests.tensorflow.horovod_session import session


@pytest.fixture(scope="session")
def tf_jobs() -> dict[int, list[dict[str, Any]]]:
    """Every rank's results, per world size: [{"cases": ..., "session": ...}, ...]."""
    pytest.importorskip("tensorflow")
    return {
        np: hora.run(session.run_job, np=np, env=session.ENV, timeout=900) for np in session.SIZES
    }
