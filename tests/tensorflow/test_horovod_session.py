"""A Horovod user's TensorFlow and Keras pytest session, run unchanged in every rank of a 3-rank
job (`session.SIZES`).

`horovodrun -np N pytest test_tensorflow.py test_tensorflow2_keras.py` runs one pytest session
per rank: every op eagerly and inside `tf.function`, the tests that expect Horovod's tf.errors
classes, gradients, process sets added and removed, shutdown and re-init, join, Keras training
with Horovod's callbacks, one after another in one process; one test's failure must not break
the next. Each test of the suites is asserted here on every rank.
"""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")

from tests.tensorflow.horovod_session import horovod_keras_suite as keras_suite
from tests.tensorflow.horovod_session import horovod_tensorflow_suite as tf_suite
from tests.tensorflow.horovod_session import session


def _names() -> list[str]:
    names = []
    # The suites' classes are not imported here by name: this module's pytest would run them.
    for cls in (tf_suite.TensorFlowEagerTests, tf_suite.TensorFlowFunctionTests,
                keras_suite.KerasTests):  # fmt: skip
        names += [f"{cls.__name__}::{n}" for n in dir(cls) if n.startswith("test_")]
    return sorted(n for n in names if not n.endswith("::test_session"))  # tf.test's, skipped


@pytest.fixture(scope="module")
def sessions(tf_jobs: dict[int, list[dict]]) -> dict[int, list[dict]]:
    return {np: [rank["session"] for rank in ranks] for np, ranks in tf_jobs.items()}


@pytest.mark.parametrize("np", session.SIZES)
@pytest.mark.parametrize("name", _names())
def test_suite_case(sessions: dict[int, list[dict]], np: int, name: str) -> None:
    ranks = sessions[np]
    assert len(ranks) == np
    for r, result in enumerate(ranks):
        got = result["outcomes"].get(name)
        assert got == "passed", f"rank {r}: {got}\n{result['failures'].get(name, '')}"


@pytest.mark.parametrize("np", session.SIZES)
def test_no_warning_from_hora_reaches_the_user(sessions: dict[int, list[dict]], np: int) -> None:
    """TensorFlow and Keras warn about their own matters; nothing hora does may warn."""
    for r, result in enumerate(sessions[np]):
        ours = [w["text"] for w in result["warnings"] if "/hora/" in w["filename"]]
        assert not ours, f"rank {r}: " + "\n".join(ours)
