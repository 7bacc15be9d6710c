"""The parts of the Spark engine's Connect support that need no server: slots from settings, the
server's version, the stories read from a Connect client's error text, the dial check, the
channel host, and `hora run --remote`'s refusals. The texts below are what a Connect client's
`SparkException` carried in real runs (pyspark 4.3, remote local[2] and a separate server)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from hora.cli import main
from hora.engines.spark import entry, failures
from hora.engines.spark.base import DRIVER_HOST_ENV
from hora.engines.spark.connect import check_version, slots_from_settings

_ABORTED = (
    "Job aborted due to stage failure: Could not recover from a failed barrier ResultStage. "
    "Most recent failure reason: Stage failed because barrier task ResultTask({stage}, {task}) "
    "finished unsuccessfully.\n"
)
_PYTHON = (
    "org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was thrown "
    "from the Python worker: Traceback (most recent call last):\n"
    '  File "/x/hora/engines/spark/entry.py", line 80, in run_task\n'
    "{error}\n SQLSTATE: 38000"
)
CRASHED = _ABORTED.format(stage=2, task=0) + (
    "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed). Consider "
    "setting 'spark.sql.execution.pyspark.udf.faulthandler.enabled' "
    "or'spark.python.worker.faulthandler.enabled' configuration to 'true' for the better Python "
    "traceback.\n\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator"
)
DRIVER = entry.runtime()


def _conf(**settings: str):
    return lambda key, default="": settings.get(key, default)


@pytest.mark.parametrize(
    ("master", "settings", "slots"),
    [
        ("local", {}, 1),
        ("local[3]", {}, 3),
        ("local[4, 2]", {"spark.task.cpus": "2"}, 2),
        ("local-cluster[2,1,1024]", {}, 2),
        ("local-cluster[3, 4, 2048]", {"spark.task.cpus": "2"}, 6),
        ("yarn", {"spark.executor.instances": "3", "spark.executor.cores": "4"}, 12),
        (
            "spark://h:7077",
            {
                "spark.executor.instances": "3",
                "spark.executor.cores": "4",
                "spark.task.resource.gpu.amount": "1",
                "spark.executor.resource.gpu.amount": "2",
            },
            6,
        ),
        ("yarn", {"spark.executor.instances": "3"}, None),  # cores: the cluster manager's call
        (
            "k8s://h",
            {
                "spark.executor.instances": "3",
                "spark.executor.cores": "4",
                "spark.dynamicAllocation.enabled": "true",
            },
            None,
        ),
        ("", {}, None),  # a server that does not say its master
    ],
)
def test_slots_come_from_the_master_and_static_settings_or_are_unknown(master, settings, slots):
    assert slots_from_settings(master, _conf(**settings)) == slots


def test_local_star_counts_this_machine_only_when_the_server_runs_here():
    assert slots_from_settings("local[*]", _conf(), in_this_process=False) is None
    assert slots_from_settings("local[*]", _conf(), in_this_process=True) == os.cpu_count()


@pytest.mark.parametrize("version", ["3.5.0", "3.5.1-databricks", "4.0.0", "4.3.0"])
def test_servers_with_barrier_map_in_arrow_are_accepted(version):
    check_version(version)


@pytest.mark.parametrize("version", ["3.4.1", "3.3.2"])
def test_an_older_server_is_refused_naming_the_upgrade(version):
    with pytest.raises(RuntimeError, match=r"Spark 3\.5 or later.*Databricks Runtime 14\.0"):
        check_version(version)


def test_a_python_mismatch_on_connect_says_the_server_chooses_the_python():
    report = {"task": 1, "host": "h1", "runtime": {**DRIVER, "hora": "0.0.1", "executable": "/x"}}
    error = _PYTHON.format(
        error=f"RuntimeError: hora did not start rank 1: ...\n{entry.MARKER}{json.dumps(report)}"
    )
    failure = failures.read(
        Exception(_ABORTED.format(stage=0, task=1) + error), DRIVER, "yarn", False, connect=True
    )
    assert (failure.task, failure.host, failure.before_start) == (1, "h1", True)
    assert failure.summary.startswith("its Python is not the driver's (hora differs)")
    assert "PYSPARK_PYTHON in the Connect server's environment" in failure.detail
    assert "spark.hora.executorPython" not in failure.detail  # no such choice on Connect


def test_a_task_that_cannot_reach_the_driver_names_the_address_and_the_override():
    report = {"task": 0, "host": "10.0.0.7", "address": ["192.168.1.5", 40123], "error": "x"}
    error = _PYTHON.format(
        error=f"RuntimeError: hora did not start rank 0\n{entry.UNREACHABLE}{json.dumps(report)}"
    )
    failure = failures.read(
        Exception(_ABORTED.format(stage=0, task=0) + error), DRIVER, "yarn", False, connect=True
    )
    assert (failure.task, failure.host, failure.before_start) == (0, "10.0.0.7", True)
    assert "cannot reach hora's driver at 192.168.1.5:40123" in failure.summary
    assert DRIVER_HOST_ENV in failure.detail and "NAT" in failure.detail


def test_a_crashed_python_worker_is_said_so():
    failure = failures.read(Exception(CRASHED), DRIVER, "local[2]", False, connect=True)
    assert failure.task == 0
    assert failure.summary.startswith("its Python worker exited unexpectedly")
    assert "\tat " not in failure.detail  # the JVM stack is left out


def test_a_python_error_in_a_task_on_connect_is_its_last_line():
    error = _PYTHON.format(error='    raise ValueError("boom")\nValueError: boom in task 1')
    failure = failures.read(
        Exception(_ABORTED.format(stage=1, task=1) + error), DRIVER, "local[2]", False, True
    )
    assert (failure.task, failure.summary) == (1, "ValueError: boom in task 1")


def test_the_dial_check_reports_a_refused_connection_and_passes_a_listening_driver():
    with socket.create_server(("127.0.0.1", 0)) as listening:
        assert entry._cannot_dial(listening.getsockname()[:2]) is None
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        closed.close()
    assert entry._cannot_dial(("127.0.0.1", port)).startswith("ConnectionRefusedError")


def test_remote_is_only_for_the_spark_backend(tmp_path, capsys):
    script = tmp_path / "s.py"
    script.write_text("")
    assert main(["run", "-np", "2", "--remote", "sc://h:1", str(script)]) == 2
    assert "--remote names a Spark Connect server" in capsys.readouterr().err


def test_finding_no_session_imports_no_pyspark():
    code = (
        "import sys, hora; from hora import engines; "
        "print(engines.resolve('auto'), 'pyspark' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["local", "False"]
