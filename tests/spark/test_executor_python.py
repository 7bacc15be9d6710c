"""Which Python the Spark tasks run, as a user's script leaves it, and the error when it is wrong.

The driver is a subprocess (`_clean_driver.py`), so that its environment is really a user's: the
venv not activated, PYSPARK_PYTHON unset, and a `python3` on the PATH that lacks hora, cloudpickle
and torch (a bare venv of the same base Python), which is what Spark starts by default. One
subprocess, three SparkSessions in its one JVM: on a local master, the default and another
PYSPARK_PYTHON (both must just work); then Spark's own choice of interpreter (must stop with one
message naming both).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import cloudpickle
import pytest

import hora
from tests.conftest import make_bare_python

pytestmark = pytest.mark.spark

HERE = Path(__file__).parent
# What a user's shell would not have set (an activated venv, a CI's Spark settings).
_NOT_A_USERS = (
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
    "VIRTUAL_ENV",
    "PYTHONPATH",
    "PYTHONHOME",
)


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """An interpreter of the same Python with nothing installed: no hora, cloudpickle, torch."""
    return make_bare_python(tmp_path_factory.mktemp("bare-venv"), lacks="cloudpickle")


@pytest.fixture(scope="module")
def clean_run(bare_python, tmp_path_factory) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _NOT_A_USERS}
    env["PATH"] = os.path.dirname(bare_python) + os.pathsep + env.get("PATH", "")
    done = subprocess.run(
        [sys.executable, str(HERE / "_clean_driver.py"), bare_python],
        cwd=tmp_path_factory.mktemp("cwd"),  # no hora in the executors' working directory
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_default_executor_python_on_a_local_master_runs_the_driver_s(clean_run, bare_python):
    assert clean_run["spark_default"] == bare_python  # Spark's own jobs get the bare python3
    driver = clean_run["driver"]
    assert clean_run["ranks"] == [["0", driver], ["1", driver]]


def test_another_pyspark_python_on_a_local_master_still_runs_the_driver_s(clean_run):
    driver = clean_run["driver"]
    assert clean_run["ranks_despite_pyspark_python"] == [["0", driver], ["1", driver]]


def test_another_python_stops_the_job_with_one_message_naming_both(clean_run, bare_python):
    assert clean_run["spark_chosen"] == bare_python
    failure = clean_run["mismatch"]
    assert "message" in failure, failure
    message = failure["message"]
    task = failure["rank"]
    assert message.splitlines()[0] == (
        f"Spark task {task} on host 127.0.0.1 could not start rank {task}: its Python is not "
        "the driver's (cloudpickle, torch and hora differ), so it cannot run the job the driver "
        "pickled"
    )
    driver = clean_run["driver"]
    rows = {
        "interpreter": (driver, bare_python),
        "python": None,  # the same Python version on both sides: listed, not a difference
        "cloudpickle": (
            cloudpickle.__version__,
            "not importable (ModuleNotFoundError: No module named 'cloudpickle')",
        ),
        "torch": (metadata.version("torch"), "not installed"),
        # hora ships itself to a Python Spark chooses (hora._shipping): there it fails on its own
        # first import, cloudpickle
        "hora": (
            hora.__version__,
            "not importable (ModuleNotFoundError: No module named 'cloudpickle')",
        ),
    }
    for key, values in rows.items():
        line = next(line for line in message.splitlines() if line.startswith(f"  {key} "))
        if values is None:
            assert "differs" not in line
            continue
        mine, theirs = values
        differs = r"   <- differs" if key != "interpreter" else ""
        assert re.fullmatch(rf"  {key}\s+{re.escape(mine)}\s+{re.escape(theirs)}{differs}", line), (
            line
        )
    assert message.rstrip().endswith(
        "On this master (local[2]) hora starts the tasks with the driver's interpreter by "
        "itself: remove spark.hora.executorPython=spark."
    )
    assert "PYSPARK_PYTHON" in message
    assert "\tat " not in message and "Traceback" not in message  # no JVM or Python stack
