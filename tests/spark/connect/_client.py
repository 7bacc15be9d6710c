"""A Spark Connect client for tests/spark/connect, run in its own process:

    python -m tests.spark.connect._client URL CHECK [CHECK ...]

URL is `local[N]` (pyspark starts the Connect server inside this process, with a classic
SparkContext next to the client: why this runs apart from pytest's process and its classic
sessions) or `sc://127.0.0.1:PORT` (a separate server). Each CHECK is one door or behaviour of
hora on that session; the client prints one line per check, `RESULT {json}`, with its value or
its error, and the test judges them. The ranks' own output goes to stdout as on any driver.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

PREFIX = "RESULT "
HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "script.py")

if sys.argv[1:2] and sys.argv[1].startswith("local"):
    # Read once, when the in-process server starts: the tasks' Python, and loopback only.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import hora  # noqa: E402
from hora import engines  # noqa: E402
from hora.engines.spark import entry  # noqa: E402
from hora.engines.spark.base import DRIVER_HOST_ENV  # noqa: E402
from hora.engines.spark.session import active_session, active_spark_context  # noqa: E402
from hora.engines.spark.task import TaskSpec  # noqa: E402
from hora.spark import (  # noqa: E402
    DeepspeedTorchDistributor,
    MirroredStrategyRunner,
    TorchDistributor,
)
from tests import _workers  # noqa: E402
from tests.spark import _jobs as _spark_jobs  # noqa: E402
from tests.spark.connect import _jobs  # noqa: E402

CHECKS: dict[str, Callable[[], Any]] = {}


def check(fn: Callable[[], Any]) -> Callable[[], Any]:
    CHECKS[fn.__name__] = fn
    return fn


@check
def session() -> dict[str, Any]:
    found = active_session()
    assert found is not None
    return {
        "kind": found.kind,
        "auto": engines.resolve("auto"),
        "spark_context": active_spark_context() is not None,
        "master": found.master,
        "slots": found.slots(),
        "channel_host": found.channel_host(),
        "channel_host_override": _overridden_channel_host(found),
    }


def _overridden_channel_host(found: Any) -> str:
    os.environ[DRIVER_HOST_ENV] = "localhost"
    try:
        return found.channel_host()
    finally:
        del os.environ[DRIVER_HOST_ENV]


@check
def runner() -> Any:
    return hora.HorovodRunner(np=2).run(_spark_jobs.whoami)


@check
def run_auto_from_a_thread() -> Any:
    """A notebook's helper thread: the session is found from it, and `auto` picks Spark."""
    results: list[Any] = []
    thread = threading.Thread(
        target=lambda: results.append(hora.run(_workers.rank_times, (10,), np=2))
    )
    thread.start()
    thread.join(300)
    return results[0]


@check
def torch_distributor() -> Any:
    return TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        _jobs.torch_train, 2.0
    )


@check
def torch_distributor_script() -> Any:
    door = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    return door.run(SCRIPT, "--door", "td-spark")


@check
def torch_distributor_local_mode() -> Any:
    door = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False)
    return [door.run(_jobs.torch_train, 1.0), door.run(SCRIPT, "--door", "td-local")]


@check
def deepspeed() -> Any:
    door = DeepspeedTorchDistributor(numGpus=2, nnodes=1, localMode=False, useGpu=False)
    return [door.run(_jobs.deepspeed_ranks), door.run(SCRIPT, "--door", "ds-spark")]


@check
def mirrored() -> Any:
    from tests.spark._tf_jobs import EXPECTED, train

    value = MirroredStrategyRunner(num_slots=2, use_gpu=False).run(train, scale=2.0)
    return {"value": value, "expected": EXPECTED}


@check
def timeline() -> Any:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        values = hora.run(
            _jobs.timeline_allreduce, np=2, backend="spark", env={"HOROVOD_TIMELINE": path}
        )
        return {"values": values, "trace": Path(path).read_text() if os.path.exists(path) else ""}


@check
def failing_rank() -> Any:
    hora.run(_spark_jobs.fail_after_peer_started, (1,), np=2, backend="spark")


@check
def restart_after_a_killed_rank() -> Any:
    return hora.run(_jobs.killed_once, np=2, backend="spark", max_restarts=1)


@check
def too_many_ranks() -> Any:
    started = time.monotonic()
    try:
        hora.Runner(np=3).run(_workers.rank_times, x=1)
    finally:
        print(f"too_many_ranks refused in {time.monotonic() - started:.1f} s", flush=True)


@check
def cancel_by_tag() -> Any:
    """The engine's own stage, its tasks stuck before their handshake, cancelled by its tag
    from another thread: the stage ends, and the session still runs queries."""
    found = active_session()
    assert found is not None
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    address = listener.getsockname()[:2]
    spec = TaskSpec(address=address, worker_address=address, secret=b"s" * 32, sys_path=())
    outcome: dict[str, Any] = {}

    def stage() -> None:
        try:
            found.run_barrier(2, entry.runtime(), dataclasses.asdict(spec), "hora-test-cancel")
            outcome["ended"] = "normally"
        except Exception as exc:
            outcome["ended"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"

    thread = found.thread(stage, name="test-stage")
    thread.start()
    deadline = time.monotonic() + 240
    while len(accepted) < 4 and time.monotonic() < deadline:  # a probe and a dial per task
        time.sleep(0.1)
    outcome["dialled"] = len(accepted)
    cancelled = time.monotonic()
    found.cancel("hora-test-cancel")
    thread.join(60)
    outcome["seconds_to_end"] = round(time.monotonic() - cancelled, 1)
    outcome["alive"] = thread.is_alive()
    listener.close()
    for conn in accepted:
        conn.close()
    outcome["after"] = found.spark.range(3).count()
    return outcome


@check
def data_from_spark() -> Any:
    """hora.data on a Connect session: written once, found again, each row once per epoch in
    two Spark ranks, and a map column refused on the client."""
    from pyspark.sql import functions as F

    import hora.data
    from tests.data import _jobs as _data_jobs

    found = active_session()
    assert found is not None
    x = F.array(F.col("id").cast("float"), F.lit(1.0).cast("float")).alias("x")
    df = found.spark.range(300).select("id", x).repartition(3)
    with tempfile.TemporaryDirectory() as store:
        dataset = hora.data.from_spark(df, store=store)
        again = hora.data.from_spark(df, store=store)
        ranks = hora.run(_data_jobs.ids_per_epoch, (dataset, 16, True, 2), np=2, backend="spark")
        refused = ""
        try:
            hora.data.from_spark(found.spark.range(2).select(F.create_map("id", "id")), store=store)
        except ValueError as exc:
            refused = str(exc)
    return {"same": dataset == again, "ids": [r["ids"] for r in ranks], "refused": refused}


@check
def data_in_place() -> Any:
    """hora.data on a Connect session: a plain scan of Parquet files (columns renamed) is read in
    place, nothing under the store; a filtered one is written."""
    from pyspark.sql import functions as F

    import hora.data
    from tests.data._parquet import write_ids

    found = active_session()
    assert found is not None
    with tempfile.TemporaryDirectory() as folder:
        write_ids(Path(folder, "files"))  # 600 rows
        store = Path(folder, "store")
        df = found.spark.read.parquet(str(Path(folder, "files")))
        dataset = hora.data.from_spark(df.select(F.col("x").alias("features"), "id"), store=store)
        written = store.exists()
        loader = dataset.loader(64, shuffle=True, rank=0, size=1)
        ids = sorted(i for batch in loader for i in batch["id"].tolist())
        filtered = hora.data.from_spark(df.filter("id < 100"), store=store)
    return {
        "origin": dataset.origin,
        "renamed": dict(dataset.renamed),
        "store_written": written,
        "every_id_once": ids == list(range(600)),
        "filtered": [filtered.origin, len(filtered)],
    }


@check
def no_pyarrow() -> Any:
    hora.run(_workers.rank_times, (1,), np=2, backend="spark")


def main() -> None:
    from pyspark.sql import SparkSession

    url, names = sys.argv[1], sys.argv[2:]
    started = time.monotonic()
    builder = SparkSession.builder.remote(url)
    if url.startswith("local"):  # the in-process server's settings (static: only warned about)
        builder = builder.config("spark.ui.showConsoleProgress", "false")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spark = builder.getOrCreate()
    print(f"{PREFIX}{json.dumps({'check': 'start', 'seconds': time.monotonic() - started})}")
    try:
        for name in names:
            started = time.monotonic()
            result: dict[str, Any] = {"check": name}
            try:
                result["value"] = CHECKS[name]()
            except BaseException as exc:
                result["error"] = type(exc).__name__
                result["message"] = str(exc)
                result["traceback"] = traceback.format_exc()
            result["seconds"] = round(time.monotonic() - started, 1)
            print(f"{PREFIX}{json.dumps(result, default=repr)}", flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
