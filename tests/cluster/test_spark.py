"""hora on Spark standalone over 2 namespaced hosts x 2 slots: 4 ranks, 2 per host.

One conformance job runs every collective case of tests/collectives/_cases.py on the 4 ranks (each
test below asserts one case on every rank), on the hierarchical data path (shared memory within
each host, gloo across; `hierarchical_matches_flat` compares it with the flat path); one training
job compares hora.torch's DistributedOptimizer with one process; then the doors on the same
cluster: TorchEstimator's fit and transform, MirroredStrategyRunner's TF_CONFIG and a
MultiWorkerMirroredStrategy step, DeepSpeed ZeRO-2 against one process, and Lightning's Trainer and
Fabric in both layouts against pyspark's own TorchDistributor. hora.data's check that every
rank's host reaches the dataset's files: files the driver and host1 hold in their own /dev/shm,
but host2 does not, are refused by host2's ranks as they build their loader, naming host2 (each
host has its own /dev/shm; the rest of the disk is the driver's). Each test names the hosts its
ranks ran on. Last, a driver of its own SIGKILLed mid-run: its ranks on both hosts end with it.

The estimator's test and the killed driver's are `slow` (`make test-slow`; the suite's budget):
the suite runs each on one host's two executors (tests/spark/estimator/test_estimator_cluster.py,
tests/spark/test_driver_death.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import hora
import hora.data
from hora.errors import WorkerFailedError
from tests import _driver_death
from tests.cluster import _jobs
from tests.cluster._checks import (
    assert_spread,
    assert_spread_per_task,
    assert_trained_like_one_process,
    placement_table,
)
from tests.cluster._cluster import Cluster
from tests.cluster.conftest import CORES, HOSTS, note, timed, wait_for_spark_executors
from tests.collectives import _cases
from tests.data import _jobs as _data_jobs

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

NP = HOSTS * CORES


@pytest.fixture(scope="module")
def conformance(spark_cluster) -> list[dict[str, Any]]:
    with timed(f"spark: conformance job ({len(_cases.CASES)} cases, np={NP})"):
        results = hora.run(_jobs.conformance, np=NP, backend="spark", timeout=240)
    note(f"spark conformance placement: {placement_table([r['where'] for r in results])}")
    return results


@pytest.fixture(scope="module")
def trained(spark_cluster) -> list[dict[str, Any]]:
    with timed(f"spark: training job (np={NP})"):
        results = hora.run(_jobs.train, np=NP, backend="spark", timeout=240)
    note(f"spark training placement: {placement_table([r['where'] for r in results])}")
    return results


def test_ranks_are_spread_two_per_host(conformance):
    assert_spread([r["where"] for r in conformance], HOSTS, CORES)


def test_ranks_of_one_host_are_contiguous(conformance):
    places = [r["where"] for r in conformance]
    table = placement_table(places)
    hosts = [p["host"] for p in places]
    first_seen = list(dict.fromkeys(hosts))
    assert hosts == sorted(hosts, key=first_seen.index), f"not host-ordered: {table}"
    for p in places:  # rank = cross_rank * local_size + local_rank, as under horovodrun
        assert p["RANK"] == p["GROUP_RANK"] * p["LOCAL_WORLD_SIZE"] + p["LOCAL_RANK"], table


def test_allreduce_reduces_within_each_host_through_shared_memory(conformance):
    """The hierarchical path: shared memory among the ranks of each real host (each namespaced
    host has its own /dev/shm), gloo across."""
    places = [r["where"] for r in conformance]
    table = placement_table(places)
    hosts = [
        [p["RANK"] for p in places if p["host"] == h]
        for h in dict.fromkeys(p["host"] for p in places)
    ]
    assert all(r["hierarchy_hosts"] == hosts for r in conformance), (
        f"hierarchical path's hosts {[r['hierarchy_hosts'] for r in conformance]}; {table}"
    )
    calls = [(r["shm_allreduce_calls"], r["hierarchical_allreduce_calls"]) for r in conformance]
    assert all(c == (1, 1) for c in calls), (
        f"(shared-memory, hierarchical) allreduces {calls}; {table}"
    )


@pytest.mark.parametrize("case", list(_cases.CASES))
def test_case(conformance, case: str) -> None:
    table = placement_table([r["where"] for r in conformance])
    failures = {
        r["where"]["RANK"]: r["cases"][case] for r in conformance if r["cases"].get(case) != "ok"
    }
    assert not failures, f"ranks on {table}:\n" + "\n".join(
        f"rank {rank}: {text}" for rank, text in failures.items()
    )


def test_distributed_optimizer_equals_one_process(trained):
    assert_spread([r["where"] for r in trained], HOSTS, CORES)
    assert_trained_like_one_process(trained)


# ----- the doors ---------------------------------------------------------------------------------
def noted_places(job: str, seen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    places = [s["where"] for s in seen]
    note(f"spark {job} placement: {placement_table(places)}")
    return places


@pytest.mark.slow  # the suite's budget: tests/spark/estimator/test_estimator_cluster.py
def test_estimator_fits_and_transforms_across_hosts(spark_cluster, tmp_path):
    """TorchEstimator.fit on 4 ranks over both hosts, its store a folder the driver and every
    executor see; TorchModel.transform on the executors gives what the fitted model gives here."""
    from pyspark.sql import SparkSession

    from tests.spark.estimator import _data

    spark = SparkSession.builder.getOrCreate()
    df = _data.digits_as_array(spark, limit=1200)
    estimator = _data.estimator(
        tmp_path / "store",
        metrics=[_data.accuracy],
        validation="is_val",
        epochs=3,
        batch_size=16,
        num_proc=NP,
        callbacks=[_jobs.SavePlace(str(tmp_path))],
        random_seed=1,
    )
    with timed(f"spark: estimator fit, 3 epochs (np={NP})"):
        fitted = estimator.fit(df)
    places = noted_places("estimator", _jobs.saved(tmp_path))
    assert_spread(places, HOSTS, CORES)
    assert fitted.getHistory()[-1]["val_accuracy"] > 0.8, fitted.getHistory()

    with timed("spark: estimator transform"):
        out = fitted.transform(df.repartition(NP))  # partitions on both hosts' executors
        rows = out.select("features", "label", "label__output").collect()
    assert len(rows) == 1200
    outputs = torch.tensor([r["label__output"] for r in rows])
    labels = torch.tensor([r["label"] for r in rows])
    assert (outputs.argmax(1) == labels).float().mean() > 0.8
    with torch.no_grad():
        here = fitted.getModel()(torch.tensor([r["features"] for r in rows], dtype=torch.float32))
    assert torch.allclose(outputs, here, atol=1e-5), (outputs - here).abs().max()


def test_mirrored_strategy_runner_spans_hosts_in_tf_config(spark_cluster: Cluster, tmp_path):
    """Each rank's TF_CONFIG names 4 workers, 2 at each host's address, its own at index = rank;
    a MultiWorkerMirroredStrategy custom-loop step averages all 4 workers' updates."""
    from hora.spark import MirroredStrategyRunner

    runner = MirroredStrategyRunner(num_slots=NP, local_mode=False, use_gpu=False)
    with timed(f"spark: MirroredStrategyRunner, {_jobs.MWMS_STEPS} MWMS steps (np={NP})"):
        first = runner.run(_jobs.mwms_steps, folder=str(tmp_path))
    seen = _jobs.saved(tmp_path)
    places = noted_places("MirroredStrategyRunner", seen)
    assert_spread(places, HOSTS, CORES)
    assert first == seen[0]
    table = placement_table(places)
    workers = seen[0]["tf_config"]["cluster"]["worker"]
    note(f"spark MirroredStrategyRunner workers: {workers}")
    assert len(set(workers)) == NP, workers
    addresses = {h.address for h in spark_cluster.hosts}
    assert {w.rsplit(":", 1)[0] for w in workers} == addresses, (workers, table)
    want_w = _jobs.mwms_expected_w(NP)
    for s, place in zip(seen, places, strict=True):
        config = s["tf_config"]
        assert config["cluster"]["worker"] == workers, table
        assert config["task"] == {"type": "worker", "index": place["RANK"]}, table
        mine = workers[place["RANK"]].rsplit(":", 1)[0]
        assert mine == spark_cluster.host(place["host"]).address, (workers, table)
        assert s["mwms"] and s["replicas"] == NP, s
        assert s["index_sums"] == [sum(range(NP))] * _jobs.MWMS_STEPS, s
        assert s["w"] == pytest.approx(want_w, rel=1e-6), (s["w"], want_w)


DATA_ROWS = 1000


def test_data_from_spark_gives_each_row_to_one_rank_once_per_epoch(spark_cluster, tmp_path):
    """hora.data.from_spark on the cluster: the executors of both hosts write the Parquet into a
    store every host sees; 4 ranks over the 2 hosts read it, each row to exactly one rank once
    per epoch, shuffled (2 epochs, each its own order) and in order."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import hora.data
    from tests.data import _jobs as _data_jobs

    spark = SparkSession.builder.getOrCreate()
    x = F.array(F.col("id").cast("float"), F.lit(1.0).cast("float")).alias("x")
    df = spark.range(DATA_ROWS).select("id", x).repartition(NP)  # written on both hosts
    with timed("spark: hora.data.from_spark, 1,000 rows"):
        dataset = hora.data.from_spark(df, store=str(tmp_path / "store"))
    assert len(dataset) == DATA_ROWS and len(dataset.files) == NP, dataset.files
    with timed(f"spark: hora.data loaders, 2 shuffled epochs and one in order (np={NP})"):
        seen = hora.run(_data_jobs.ids_each_way, (dataset, 16, 2), np=NP, backend="spark")
    hosts = [s["host"] for s in seen]
    assert sorted(hosts.count(h) for h in set(hosts)) == [CORES] * HOSTS, hosts
    assert [s["size"] for s in seen] == [NP] * NP
    epochs = [[i for s in seen for i in s["ids"][e]] for e in range(2)] + [
        [i for s in seen for i in s["ordered"]]
    ]
    for epoch, ids in enumerate(epochs):
        assert sorted(ids) == list(range(DATA_ROWS)), epoch
    assert epochs[0] != epochs[1]  # each epoch its own order
    assert epochs[2] == _ids_in_file_order(dataset)  # unshuffled: the files' order, by rank


def _ids_in_file_order(dataset: Any) -> list[int]:
    import pyarrow.parquet as pq

    tables = [pq.read_table(os.path.join(dataset.uri, f), columns=["id"]) for f in dataset.files]
    return [i for t in tables for i in t.column("id").to_pylist()]


def test_data_from_spark_refuses_a_store_the_driver_does_not_see(spark_cluster, tmp_path):
    """Each namespaced host has its own /dev/shm: the executors write there, and the driver
    (whose /dev/shm is the machine's) finds none of it."""
    from pyspark.sql import SparkSession

    import hora.data

    spark = SparkSession.builder.getOrCreate()
    store = f"/dev/shm/hora-test-{os.getpid()}-{tmp_path.name}"
    try:
        with pytest.raises(ValueError, match="one place for the driver, every executor"):
            hora.data.from_spark(spark.range(100).repartition(NP), store=store)
    finally:
        shutil.rmtree(store, ignore_errors=True)


DELTA_ROWS = 200  # per file: ids 0..199 in the first, 200..399 in the second


def test_data_from_delta_trains_only_live_rows_across_hosts(spark_cluster, tmp_path):
    """hora.data.from_delta on the cluster, a table in a folder every host sees: v0 and v1 write
    a file each (row groups of 64), v2 deletes rows of both with deletion vectors (one inline,
    one in a file of its own), v3 overwrites. One job over 4 ranks on the 2 hosts reads the
    latest version and v2: each live row reaches exactly one rank once per epoch, a deleted row
    never does."""
    deltalake = pytest.importorskip("deltalake", reason="deltalake is not installed")
    import pyarrow as pa

    import hora.data
    from tests.data import _delta_log
    from tests.data import _jobs as _data_jobs

    def ids(start: int, rows: int) -> pa.Table:
        x = pa.array([[float(i), 1.0] for i in range(start, start + rows)], pa.list_(pa.float32()))
        return pa.table({"id": list(range(start, start + rows)), "x": x})

    table = tmp_path / "table"
    small_groups = deltalake.WriterProperties(max_row_group_size=64)
    deltalake.write_deltalake(str(table), ids(0, DELTA_ROWS), writer_properties=small_groups)
    (first,) = _delta_log.live_adds(table)
    deltalake.write_deltalake(
        str(table), ids(DELTA_ROWS, DELTA_ROWS), mode="append", writer_properties=small_groups
    )
    (second,) = set(_delta_log.live_adds(table)) - {first}
    gone_first = [*range(10), 63, 64, *range(128, 192), 199]  # a group boundary, a whole group
    gone_second = list(range(0, DELTA_ROWS, 7))
    deleted_at = _delta_log.delete_rows(
        table, {first: gone_first, second: gone_second}, {first: True, second: False}
    )
    deleted = set(gone_first) | {DELTA_ROWS + i for i in gone_second}
    live = [i for i in range(2 * DELTA_ROWS) if i not in deleted]
    read = deltalake.DeltaTable(str(table), version=deleted_at).scan(columns=["id"])
    assert sorted(pa.table(read).column("id").to_pylist()) == live  # deltalake's own reader
    deltalake.write_deltalake(str(table), ids(1000, 100), mode="overwrite")
    newest = list(range(1000, 1100))

    latest = hora.data.from_delta(table)
    older = hora.data.from_delta(table, version=deleted_at)
    assert (len(latest), len(older)) == (len(newest), len(live))
    with timed(f"spark: hora.data.from_delta, latest and with deletion vectors (np={NP})"):
        seen = hora.run(_data_jobs.ids_of_each, ([latest, older], 8, 2), np=NP, backend="spark")
    hosts = [s["host"] for s in seen]
    assert sorted(hosts.count(h) for h in set(hosts)) == [CORES] * HOSTS, hosts
    assert sorted(s["rank"] for s in seen) == list(range(NP))
    assert [s["size"] for s in seen] == [NP] * NP
    for index, want in enumerate((newest, live)):
        for epoch in range(2):
            got = [i for s in seen for i in s["each"][index][epoch]]
            assert not deleted & set(got), (index, epoch, sorted(deleted & set(got)))
            assert sorted(got) == want, (index, epoch)


ZERO2 = {
    "train_micro_batch_size_per_gpu": 8,
    "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}},  # nothing to build
    "zero_optimization": {"stage": 2},
}
DRIVERS_NINJA = os.path.dirname(shutil.which("ninja") or "") or None


ROWS = 600  # write_ids's


def write_ids(folder: Path) -> hora.data.Dataset:
    """3 files of 200 rows (row groups of 50): an id and a 2-vector, as _data_jobs reads."""
    folder.mkdir(parents=True)
    for f in range(3):
        ids = np.arange(f * 200, (f + 1) * 200)
        x = pa.array([[float(i), 1.0] for i in ids], pa.list_(pa.float32()))
        pq.write_table(
            pa.table({"id": ids, "x": x}), folder / f"part-{f}.parquet", row_group_size=50
        )
    return hora.data.from_parquet(folder)


def test_files_one_host_cannot_read_are_refused_naming_it(spark_cluster, tmp_path):
    cluster = spark_cluster
    shared = write_ids(tmp_path / "data")  # every host reads tmp_path
    with timed(f"spark: hora.data loaders over files every host sees (np={NP})"):
        seen = hora.run(_data_jobs.ids_each_way, (shared, 16, 1), np=NP, backend="spark")
    assert sorted({s["host"] for s in seen}) == ["host1", "host2"], seen
    for ids in ([i for s in seen for i in s["ids"][0]], [i for s in seen for i in s["ordered"]]):
        assert sorted(ids) == list(range(ROWS))

    host1, host2 = cluster.host("host1"), cluster.host("host2")
    assert host1.name == "host1" and host2.name == "host2"  # their hostnames
    place = f"/dev/shm/hora-test-{os.getpid()}-{tmp_path.name}"
    shutil.copytree(tmp_path / "data", place)  # the driver's (the machine's) /dev/shm
    cluster.network.run(host1, ["cp", "-r", str(tmp_path / "data"), place])
    try:
        dataset = hora.data.from_parquet(place)  # the driver reads its footers
        with (
            timed(f"spark: hora.data loaders over files host2 does not hold (np={NP})"),
            pytest.raises(WorkerFailedError) as failed,
        ):
            hora.run(_data_jobs.ids_each_way, (dataset, 16, 1), np=NP, backend="spark")
    finally:
        cluster.network.run(host1, ["rm", "-rf", place])
        shutil.rmtree(place, ignore_errors=True)
    message = str(failed.value)
    assert "on host 'host2' does not find 3 of the dataset's 3 files" in message, message
    assert "every rank's host must reach the data" in message
    assert "on host 'host1'" not in message
    assert os.path.basename(place) not in cluster.network.run(host2, ["ls", "-A", "/dev/shm"])
    # only host2's ranks failed (a job's ranks are host-ordered: 2 per host, contiguous)
    assert len({rank // CORES for rank in failed.value.failed_ranks}) == 1, failed.value


def test_deepspeed_zero2_across_hosts_trains_as_one_process(spark_cluster, tmp_path):
    """ZeRO-2 on 4 ranks (micro-batch 8 each) over both hosts: each step's mean loss over the
    ranks is the loss of one process whose micro-batch is the 4 ranks' 32 rows."""
    from hora.spark import DeepspeedTorchDistributor

    spread, alone = tmp_path / "spread", tmp_path / "alone"
    spread.mkdir()
    alone.mkdir()
    with timed(f"spark: DeepSpeed ZeRO-2 (np={NP})"):
        DeepspeedTorchDistributor(
            numGpus=CORES, nnodes=HOSTS, localMode=False, useGpu=False, deepspeedConfig=ZERO2
        ).run(_jobs.deepspeed_losses, str(spread), DRIVERS_NINJA)
    seen = _jobs.saved(spread)
    places = noted_places("DeepSpeed ZeRO-2", seen)
    assert_spread_per_task(places, HOSTS, CORES)  # pyspark's torchrun per task
    assert all(s["world"] == NP and s["stage"] == 2 for s in seen), seen
    assert [s["local_rank"] for s in seen] == [p["LOCAL_RANK"] for p in places]

    one = {**ZERO2, "train_micro_batch_size_per_gpu": 8 * NP}
    runner = DeepspeedTorchDistributor(numGpus=1, localMode=True, useGpu=False, deepspeedConfig=one)
    with timed("local: DeepSpeed ZeRO-2, one process"):
        runner.run(_jobs.deepspeed_losses, str(alone), DRIVERS_NINJA)
    (reference,) = _jobs.saved(alone)
    mean = torch.tensor([s["losses"] for s in seen]).mean(0)
    want = torch.tensor(reference["losses"])
    assert torch.allclose(mean, want, rtol=1e-4, atol=1e-5), (mean, want)
    assert want[-1] < want[0]


LIGHTNING_LAYOUTS = [(2, 1), (1, 2)]  # (devices, num_nodes): one machine's, tasks as nodes


@pytest.mark.clients
def test_lightning_both_layouts_one_task_per_host_as_under_pyspark(spark_cluster, tmp_path):
    """Lightning's Trainer and Fabric in both layouts under hora's and pyspark's TorchDistributor
    (num_processes=2, local_mode=False) on the same cluster, one task per host: the same ranks,
    losses and weights. `devices=1, num_nodes=2` is Databricks' layout; in `devices=2,
    num_nodes=1`, one task per host, Lightning not seeing a torchrun launch (no
    TORCHELASTIC_RUN_ID) makes rank 1 global rank node x devices = 2 of 2 (gloo: rank < size)."""
    pytest.importorskip("lightning", reason="the clients extra is not installed")
    from pyspark.ml.torch.distributor import TorchDistributor as PysparkTorchDistributor

    from hora.spark import TorchDistributor
    from tests.clients.conftest import results

    seen: dict[str, list[dict[str, Any]]] = {}
    places: dict[str, list[dict[str, Any]]] = {}
    for name, door in (
        ("hora", TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)),
        ("pyspark", PysparkTorchDistributor(num_processes=2, local_mode=False, use_gpu=False)),
    ):
        out = tmp_path / name
        with timed(f"spark: {name}'s TorchDistributor, Lightning in 2 layouts x 2 APIs (np=2)"):
            door.run(_jobs.lightning, str(out), LIGHTNING_LAYOUTS)
        places[name] = noted_places(f"{name} Lightning", _jobs.saved(out))
        seen[name] = results(out, "lightning")
    for name, where in places.items():  # one torchrun (pyspark) or rank (hora) per task
        table = placement_table(where)
        assert sorted(p["host"] for p in where) == ["host1", "host2"], (name, table)
        assert [(p["LOCAL_RANK"], p["LOCAL_WORLD_SIZE"]) for p in where] == [(0, 1)] * 2, table
        assert [p["GROUP_RANK"] for p in where] == [0, 1], (name, table)
    assert seen["hora"] == seen["pyspark"]
    for rank, cases in enumerate(seen["hora"]):
        assert sorted(cases) == sorted(
            f"{api} {d}x{n}" for api in ("trainer", "fabric") for d, n in LIGHTNING_LAYOUTS
        )
        for case in cases.values():  # [global rank, local rank, node rank, world size]
            assert case["environment"] == "TorchElasticEnvironment", cases
            assert case["ranks"] == [rank, 0, rank, 2], cases


# ----- a killed driver ---------------------------------------------------------------------------
@contextlib.contextmanager
def slots_for_another_driver() -> Iterator[None]:
    """This process's executors stopped, its SparkSession kept, so that another driver's
    application gets every slot of the cluster; its executors started again after."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    assert sc is not None
    scala = sc._jsc.sc()
    scala.killExecutors(scala.getExecutorIds())  # and the application's executor limit: 0
    try:
        wait_until(lambda: scala.getExecutorMemoryStatus().size() == 1, "executors killed")
        yield
    finally:
        scala.requestExecutors(HOSTS)
        wait_for_spark_executors(sc, HOSTS)


def wait_until(done: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
    """Until `done()`; fails, saying `what` did not happen, after `seconds`."""
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, f"not {what} after {seconds} s"
        time.sleep(0.1)


def segments_on_hosts(cluster: Cluster) -> dict[str, set[str]]:
    """hora's shared-memory segments in each host's own /dev/shm."""
    found = {}
    for host in cluster.hosts:
        names = cluster.network.run(host, ["ls", "-A", "/dev/shm"]).split()
        found[host.name] = {name for name in names if name.startswith("hora")}
    return found


@pytest.mark.slow  # the suite's budget: tests/spark/test_driver_death.py on local-cluster
def test_a_killed_drivers_ranks_on_every_host_are_gone_within_seconds(spark_cluster, tmp_path):
    """A driver of its own (its own SparkSession and application on this cluster, 4 ranks, 2
    per host) SIGKILLed mid-run: the ranks on both hosts (and the child each started) see its
    channel close and are gone within seconds, in far less than the heartbeat silence time;
    its executor JVMs and their Python workers end too, and no host's /dev/shm keeps the
    segment its ranks met in."""
    cluster = spark_cluster
    address = cluster.driver_address
    conf = {
        "spark.driver.host": address,
        "spark.driver.bindAddress": address,
        "spark.executor.memory": "512m",
        "spark.executor.cores": str(CORES),
    }
    segments = segments_on_hosts(cluster)
    with slots_for_another_driver():
        driver = _driver_death.start_driver(
            tmp_path, "spark", str(tmp_path), cluster.spark_master, str(NP), json.dumps(conf)
        )
        try:
            with timed(f"spark: a killed driver's own session and job (np={NP}) up"):
                ranks = _driver_death.wait_for_ranks(driver, np=NP)
            hosts = {r["host"] for r in ranks}
            assert hosts == {h.name for h in cluster.hosts}, ranks
            assert len(driver.executors()) == HOSTS  # they carry its tag, on the hosts too
            assert all(r["shm"] for r in ranks), ranks  # each host's ranks met in shared memory
            pids = [pid for r in ranks for pid in (r["pid"], r["child"])]
            took = _driver_death.kill_and_time(driver, pids)
            rest, left = _driver_death.wait_until_gone(driver.tagged, 30)
        finally:
            driver.stop()
    said = (
        f"spark: a killed driver's ranks on {len(hosts)} hosts gone {took:.2f} s after, its "
        f"executors and their Python workers {took + rest:.2f} s after"
    )
    note(said)
    assert not left, left
    assert segments_on_hosts(cluster) == segments
