"""Every test must leave behind no hora worker process, no thread and no environment variable.

Workers inherit the driver's environment, so a tag set here marks every process this test session
starts, grandchildren included, even after they are orphaned; other sessions' workers differ.
Threads and variables are compared before and after each test (as Lightning's tests do), so
what a module- or session-scoped fixture started (a SparkSession, a Ray head) is not the test's;
what libraries start or set once per process, the first time a test uses them, is listed below.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
import venv
from pathlib import Path

import pytest

from tests._procs import pids_with_env

TAG = "HORA_TEST_SESSION"
os.environ[TAG] = uuid.uuid4().hex
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# every Spark the suite starts reads tests/spark_conf/spark-defaults.conf (its JVMs' JIT: C1 only)
os.environ.setdefault("SPARK_CONF_DIR", str(Path(__file__).parent / "spark_conf"))


def tagged_processes() -> list[int]:
    """PIDs of live processes (not zombies) started under this test session's tag."""
    return pids_with_env(TAG, os.environ[TAG], zombies=False)


def worker_processes() -> list[int]:
    """Live hora worker processes started under this test session."""
    found = []
    for pid in tagged_processes():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if b"hora.rank.worker" in cmdline:
            found.append(pid)
    return found


def make_bare_python(folder: Path, lacks: str) -> str:
    """An interpreter of this same Python with nothing installed (no hora, cloudpickle, torch,
    pyarrow), made in `folder`; checked to lack the module `lacks`."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(folder)
    python = folder / "bin" / "python3"
    found = subprocess.run(
        [str(python), "-c", f"import importlib.util as u; print(u.find_spec({lacks!r}))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert found.stdout.strip() == "None", f"{python} has {lacks}"
    return str(python)


def wait_for_no_processes(timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := tagged_processes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.fixture(autouse=True)
def no_worker_survives(request):
    yield
    if request.node.get_closest_marker("spark"):
        return  # Spark's own JVM and Python daemons carry the tag too; its tests check workers
    if request.node.get_closest_marker("ray"):
        return  # so do Ray's GCS, raylet and workers; tests/ray checks workers, actors, groups
    left = tagged_processes()
    assert not left, f"processes left running after the test: {left}"


# Variables that libraries set in their own process, once, the first time a test uses them.
LIBRARY_VARIABLES = frozenset(
    {
        "PYTEST_CURRENT_TEST",  # pytest's own, renamed for each phase of a test
        "SPARK_AUTH_SOCKET_TIMEOUT",  # pyspark, when a SparkContext starts
        "SPARK_BUFFER_SIZE",  # same
        "PYTHONBREAKPOINT",  # ray.init
        "RAY_CLIENT_MODE",  # same
        "_MLFLOW_TELEMETRY_SESSION_ID",  # importing mlflow (or deepspeed, which imports it)
        "PYTORCH_NVML_BASED_CUDA_CHECK",  # importing deepspeed
        "TORCHINDUCTOR_CACHE_DIR",  # torch's inductor, the first time it looks for its cache
        "KMP_DUPLICATE_LIB_OK",  # importing tensorflow, keras or scikit-learn
        "KMP_INIT_AT_FORK",  # same
        "ENABLE_RUNTIME_UPTIME_TELEMETRY",  # importing tensorflow (or keras)
        "HDF5_PLUGIN_PATH",  # same
        "TF2_BEHAVIOR",  # same
        "TPU_ML_PLATFORM",  # same
        "TPU_ML_PLATFORM_VERSION",  # same
    }
)
# Python threads that libraries keep for the life of the process or of a session, told apart by
# the module their code comes from (their names are often just "Thread-N").
LIBRARY_THREAD_MODULES = (
    "py4j.",  # py4j's FinalizerWorker, one per JVM gateway
    "pyspark.",  # the SparkContext's accumulator server
    "ray.",  # ray's error listener and GC thread, while ray is initialised
)
THREAD_GRACE_S = 5.0  # a thread told to stop may take a moment to get there


@pytest.fixture(autouse=True)
def no_environment_variable_leaks():
    """Fail a test that leaves os.environ changed, and put it back as it was."""
    before = dict(os.environ)
    yield
    changed = {
        name
        for name in before.keys() | os.environ.keys()
        if before.get(name) != os.environ.get(name) and name not in LIBRARY_VARIABLES
    }
    for name in changed:
        if name in before:
            os.environ[name] = before[name]
        else:
            del os.environ[name]
    assert not changed, f"the test left environment variables changed: {sorted(changed)}"


def _thread_origin(thread: threading.Thread) -> str:
    """The module the thread's code comes from: its target's (or the target's object's), or
    its class's when it has no target."""
    target = getattr(thread, "_target", None)  # CPython's Thread keeps it while it runs
    if target is None:
        return type(thread).__module__
    owner = getattr(target, "__self__", None)
    return type(owner).__module__ if owner is not None else getattr(target, "__module__", "")


def _leaked(thread: threading.Thread) -> bool:
    if not thread.is_alive():
        return False
    if thread.name.startswith("hora"):  # hora's own, whatever wraps them (a pyspark thread)
        return True
    return not f"{_thread_origin(thread)}.".startswith(LIBRARY_THREAD_MODULES)


@pytest.fixture(autouse=True)
def no_thread_leaks():
    """Fail a test that leaves a thread running that it started (after a short grace)."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + THREAD_GRACE_S
    while (left := [t for t in threading.enumerate() if t not in before and _leaked(t)]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    described = [f"{t.name} ({_thread_origin(t)})" for t in left]
    assert not left, f"the test left threads running: {described}"


#: the folders whose every test carries a marker (`pytest -m "not tensorflow"`); modules
#: elsewhere that run one framework carry it themselves (`pytestmark`)
FOLDER_MARKERS = {"tensorflow": "tensorflow", "deepspeed": "deepspeed", "gpu": "gpu"}


def pytest_addoption(parser):
    parser.addoption(
        "--slow",
        action="store_true",
        help="also run the `slow` family (the costliest runs: DEVELOPERS.md; `make test-slow`)",
    )


def pytest_collection_modifyitems(config, items):
    """Mark each test in a framework's or the GPU's folder with that folder's marker; skip the
    `slow` family unless `--slow` asks for it (whatever `-m` says: the suite's budget)."""
    tests = Path(__file__).parent
    run_slow = config.getoption("--slow")
    for item in items:
        parts = Path(str(item.fspath)).relative_to(tests).parts
        marker = FOLDER_MARKERS.get(parts[0]) if len(parts) > 1 else None
        if marker is not None:
            item.add_marker(marker)
        if not run_slow and item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.skip(reason="the slow family: `make test-slow` runs it"))
