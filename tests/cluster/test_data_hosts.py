"""hora.data's check that every rank's host reaches the dataset's files, on Spark standalone over 2
namespaced hosts x 2 slots (each host its own /dev/shm; the rest of the disk is the driver's).

Files the driver and host1 hold in their own /dev/shm, but host2 does not, are refused by
host2's ranks as they build their loader, before any batch, naming host2; the same files from a
folder every host sees give each row to exactly one rank once per epoch, as a check that the
check refuses nothing it should let through. One cluster start, two jobs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import hora
import hora.data
from hora.errors import WorkerFailedError
from tests.cluster.conftest import CORES, HOSTS, timed
from tests.data import _jobs as _data_jobs

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

NP = HOSTS * CORES
ROWS = 600


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
