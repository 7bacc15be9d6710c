"""Real Spark Connect for hora's Spark doors: a client process per session, judged here.

The clients run apart from pytest's process: `SparkSession.builder.remote("local[N]")` starts a
classic SparkContext inside its process (it hosts the Connect server there), which would meet the
classic sessions of tests/spark; and a separate server needs a client in another process anyway.
The modules that start Spark Connect skip cleanly without its client libraries or Java.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import tagged_processes, worker_processes

pytest.importorskip("pyspark", reason="pyspark is not installed")


def require_spark_connect() -> None:
    """Skip a module that starts Spark Connect where it cannot: no client libraries, no Java."""
    pytest.importorskip("pyarrow", reason="pyarrow is not installed")
    pytest.importorskip("grpc", reason="pyspark's Spark Connect client (grpcio) is not installed")
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("Java is not installed: Spark cannot start", allow_module_level=True)


REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "script.py"
CLIENT_TIMEOUT = 900


@dataclass
class ClientRun:
    """One client process: its results by check, and everything it printed."""

    results: dict[str, dict[str, Any]]
    output: str
    returncode: int
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)
    #: checks this client did not run, and why (`ONE_KIND_ONLY`): a test of one skips
    left_out: dict[str, str] = field(default_factory=dict)

    def value(self, check: str) -> Any:
        if check in self.left_out:
            pytest.skip(f"{check}: {self.left_out[check]}")
        result = self.results.get(check)
        assert result is not None, f"the client did not report {check!r}:\n{self.output[-4000:]}"
        assert "error" not in result, f"{check}: {result.get('traceback')}"
        return result["value"]

    def error(self, check: str) -> dict[str, Any]:
        result = self.results.get(check)
        assert result is not None, f"the client did not report {check!r}:\n{self.output[-4000:]}"
        assert "error" in result, f"{check} did not fail: {result.get('value')!r}"
        return result


def client_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SPARK_REMOTE", None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYSPARK_PYTHON"] = sys.executable
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env.update(extra)
    return env


def run_client(
    url: str,
    checks: list[str],
    env: dict[str, str] | None = None,
    module: str = "tests.spark.connect._client",
) -> ClientRun:
    """`python -m MODULE URL CHECKS...` in the repository; its results."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", module, url, *checks],
        cwd=REPO,
        env=env or client_env(),
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT,
    )
    output = done.stdout + done.stderr
    results = {}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
            results[result["check"]] = result
    run = ClientRun(results, output, done.returncode, time.monotonic() - started)
    run.timings = {name: r.get("seconds", 0.0) for name, r in results.items()}
    print(f"client {url}: {run.seconds:.0f} s; per check: {run.timings}")
    return run


@pytest.hookimpl(trylast=True)  # after pytest has grouped the tests by the url fixture's params
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests here that need no Connect session run first: the separate server lives until the
    last test that asks for it, and every test that is not marked `spark` checks afterwards that
    no tagged process (the server's included) is left."""
    mine = [i for i, item in enumerate(items) if Path(item.path).parent == HERE]
    ordered = sorted((items[i] for i in mine), key=lambda item: "url" in item.fixturenames)
    for i, item in zip(mine, ordered, strict=True):
        items[i] = item


@pytest.fixture(scope="package", params=["remote-local", "separate-server"])
def url(request, tmp_path_factory):
    """Where a client connects: `remote("local[2]")` in the client's own process, or a Connect
    server started here from the pyspark wheel over `local-cluster[2,1,1024]`, one for all the
    modules that ask for it (pytest runs their tests on one kind of session, then the other)."""
    if request.param == "remote-local":
        yield "local[2]"
        return
    from tests.spark.connect._server import ConnectServer

    log = tmp_path_factory.mktemp("connect-server") / "server.log"
    server = ConnectServer.start("local-cluster[2,1,1024]", sys.executable, log, client_env())
    print(f"Connect server up in {server.started_s:.0f} s at {server.url}")
    try:
        yield server.url
    finally:
        server.stop()


#: What the client of test_doors.py and test_data.py runs, in this order, on each kind of session
DOOR_CHECKS = [
    "session",
    "runner",
    "run_auto_from_a_thread",
    "torch_distributor",
    "torch_distributor_script",
    "torch_distributor_local_mode",
    "deepspeed",
    "timeline",
    "failing_rank",
    "restart_after_a_killed_rank",
    "too_many_ranks",
    "cancel_by_tag",
]
if importlib.util.find_spec("tensorflow") is not None:  # MirroredStrategyRunner's ranks need it
    DOOR_CHECKS.append("mirrored")
DOOR_CHECKS += ["data_from_spark", "data_in_place"]

#: The door checks run on one kind of session only (each is a launch: seconds on 2 cores; the
#: suite's budget): hora's code on a Connect session is the same on both kinds, and these depend
#: on nothing that tells them apart. On the separate server, where executors are JVMs of their
#: own and a stage outlives its response stream (reattached): DeepSpeed's and
#: MirroredStrategyRunner's doors, the timeline, and hora.data (its files written and read by
#: those executors). On `remote("local[2]")`: TorchDistributor's local mode, whose ranks run on
#: the client and never reach the server. The other door checks run on both.
ONE_KIND_ONLY = {
    "separate-server": ["deepspeed", "mirrored", "timeline", "data_from_spark", "data_in_place"],
    "remote-local": ["torch_distributor_local_mode"],
}


def kind_of(url: str) -> str:
    """The `url` fixture's param for its value."""
    return "remote-local" if url.startswith("local") else "separate-server"


def ml_checks_run_here() -> bool:
    """test_estimator.py's client libraries: pyspark.ml.connect's evaluators need torcheval, the
    digits come from scikit-learn."""
    return all(importlib.util.find_spec(name) for name in ("torcheval", "sklearn"))


def ml_checks(url: str) -> list[str]:
    """test_estimator.py's checks (`_ml_client`): the pipeline fitted on a Spark DataFrame on
    `remote("local[2]")`, on a pandas one on the separate server (both inputs covered)."""
    fit_on = "spark" if kind_of(url) == "remote-local" else "pandas"
    return [f"ml_connect_pipeline_on_{fit_on}", "large_model_as_artifact"]


@pytest.fixture(scope="package")
def doors_client(url):
    """One client process per kind of session for the doors', hora.data's and the estimator's
    checks (each such process starts a session, and on `remote("local[2]")` a JVM: seconds on 2
    cores); the checks of the other kind only (`ONE_KIND_ONLY`) left out."""
    kind = kind_of(url)
    (other,) = (k for k in ONE_KIND_ONLY if k != kind)
    why = f"runs on the {other} session only (ONE_KIND_ONLY)"
    left_out = dict.fromkeys(ONE_KIND_ONLY[other], why)
    checks = [c for c in DOOR_CHECKS if c not in left_out]
    if not ml_checks_run_here():
        run = run_client(url, checks)
    else:  # _ml_client's checks and, through its import of _client, the doors'
        run = run_client(url, checks + ml_checks(url), module="tests.spark.connect._ml_client")
    run.left_out = left_out
    return run


@pytest.fixture(scope="package", autouse=True)
def nothing_left_running():
    """After the Connect tests: no client, server, executor or hora worker process survives."""
    yield
    deadline = time.monotonic() + 20
    while tagged_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not worker_processes(), f"hora workers left running: {worker_processes()}"
    assert not tagged_processes(), f"processes left running: {tagged_processes()}"
