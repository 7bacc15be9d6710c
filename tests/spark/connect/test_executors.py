"""A Connect server whose executors' Python lacks what hora needs: one error that says what to
install where, before any rank starts. The server's Python is fixed when it starts (the client
cannot choose it), so this is a client process of its own, on `remote("local[2]")` whose tasks
run a bare interpreter of the same Python (no pyarrow, cloudpickle, torch or hora)."""

from __future__ import annotations

import pytest

from tests.conftest import make_bare_python
from tests.spark.connect.conftest import client_env, require_spark_connect, run_client

require_spark_connect()
pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    return make_bare_python(tmp_path_factory.mktemp("bare-venv"), lacks="pyarrow")


def test_executors_without_pyarrow_fail_before_any_rank_saying_what_to_install(bare_python):
    run = run_client("local[2]", ["no_pyarrow"], env=client_env(PYSPARK_PYTHON=bare_python))
    failed = run.error("no_pyarrow")
    assert failed["error"] == "WorkerFailedError"
    message = failed["message"]
    assert "could not start rank" in message  # no rank ran
    assert "the executors' Python has no pyarrow" in message
    assert "PYSPARK_PYTHON in the Connect server's environment" in message
    assert "Install pyarrow, torch and hora" in message
