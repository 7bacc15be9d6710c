"""hora.data.from_spark on Spark Connect's separate server (see test_doors.py): the DataFrame is
written once and found again, and every row reaches exactly one Spark rank once per epoch; a
plain scan of Parquet is read in place, from the client's own plan. The checks run in
test_doors.py's client process (`doors_client`), after the doors' checks; on the separate server
only (`conftest.ONE_KIND_ONLY`: its executors, JVMs of their own, write and read the files;
hora.data's code is the same on `remote("local[2]")`, whose tests here are skipped, saying so)."""

from __future__ import annotations

import itertools

import pytest

from tests.spark.connect.conftest import require_spark_connect

require_spark_connect()
pytestmark = pytest.mark.spark


def test_from_spark_on_connect_gives_each_row_once_per_epoch(doors_client):
    found = doors_client.value("data_from_spark")
    assert found["same"] is True
    assert len(found["ids"]) == 2
    for epoch in range(2):
        ids = list(itertools.chain(*(rank[epoch] for rank in found["ids"])))
        assert sorted(ids) == list(range(300)), epoch
    assert "is a map" in found["refused"], found["refused"]


def test_a_plain_scan_on_connect_is_read_in_place(doors_client):
    found = doors_client.value("data_in_place")
    assert found["origin"] == "in place" and not found["store_written"], found
    assert found["renamed"] == {"features": "x"}
    assert found["every_id_once"] is True
    assert found["filtered"] == ["written", 100]
