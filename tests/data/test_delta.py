"""from_delta without Spark: a Delta table written by deltalake, rows deleted by deletion vectors
committed by hand (and read back by deltalake first, an independent reader), then trained on:
each live row reaches exactly one rank once per epoch, a deleted one never; older versions give
older rows; what hora cannot read is refused by name."""

from __future__ import annotations

import itertools
import json
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import hora
import hora.data
from hora.data._files import kept_rows, pack_deleted
from tests.data import _delta_log, _jobs
from tests.data._parquet import step_world

deltalake = pytest.importorskip("deltalake", reason="deltalake is not installed")

ROWS = 300  # per file: ids 0..299 in the first, 300..599 in the second
GROUP = 64


def ids_table(start: int, rows: int) -> pa.Table:
    ids = np.arange(start, start + rows)
    return pa.table(
        {
            "id": ids,
            "x": pa.array([[float(i), 1.0] for i in ids], pa.list_(pa.float32())),
            "text": [f"row {i}" for i in ids],
        }
    )


def live_ids(table, version=None) -> list[int]:
    """The ids deltalake itself reads (its scan applies deletion vectors)."""
    found = deltalake.DeltaTable(str(table), version=version).scan(columns=["id"])
    return sorted(pa.table(found).column("id").to_pylist())


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """v0, v1: two files of 300 rows (row groups of 64); v2: deletion vectors on both (one
    inline, one in a file), a whole row group of the first among the deleted rows; v3: an
    overwrite with ids 1000..1099."""
    path = tmp_path_factory.mktemp("delta") / "table"
    properties = deltalake.WriterProperties(max_row_group_size=GROUP)
    deltalake.write_deltalake(str(path), ids_table(0, ROWS), writer_properties=properties)
    deltalake.write_deltalake(
        str(path), ids_table(ROWS, ROWS), mode="append", writer_properties=properties
    )
    files = {}
    for name in _delta_log.live_adds(path):
        first = pq.read_table(path / name, columns=["id"]).column("id")[0].as_py()
        files[first] = name
    first = [*range(10), 63, 64, *range(128, 192), 299]  # a group boundary, a whole group
    second = list(range(0, ROWS, 7))
    _delta_log.delete_rows(
        path, {files[0]: first, files[ROWS]: second}, {files[0]: True, files[ROWS]: False}
    )
    deleted = set(first) | {ROWS + i for i in second}
    live = [i for i in range(2 * ROWS) if i not in deleted]
    assert live_ids(path) == live  # the table is valid for deltalake's reader
    deltalake.write_deltalake(str(path), ids_table(1000, 100), mode="overwrite")
    return {"path": path, "live": live, "files": files}


def world(dataset, size, shuffle, batch=16):
    return [
        dataset.loader(batch, shuffle=shuffle, rank=r, size=size, columns=["id", "x"], seed=5)
        for r in range(size)
    ]


def test_deleted_rows_never_reach_a_rank(table):
    dataset = hora.data.from_delta(table["path"], version=2)
    live = table["live"]
    assert dataset.origin == "delta" and len(dataset) == len(live)
    assert all(p.rows <= GROUP for p in dataset.pieces)
    assert len(dataset.pieces) == 9  # 2 files of 5 row groups, one group all deleted
    assert sum(bool(p.deleted) for p in dataset.pieces) == 8
    assert len(pickle.dumps(dataset)) < 4096  # deletion vectors packed, not listed
    for size, shuffle in itertools.product([1, 2, 3], [False, True]):
        loaders = world(dataset, size, shuffle)
        orders = []
        for epoch in range(2):
            for loader in loaders:
                loader.set_epoch(epoch)
            seen = step_world(loaders)
            assert sorted(itertools.chain(*seen)) == live, (size, shuffle, epoch)
            orders.append(list(itertools.chain(*seen)))
        assert (orders[0] == orders[1]) is (not shuffle)
        if not shuffle:  # the live rows in file order
            by_file = [
                sorted(i for i in live if (i >= ROWS) == (name == table["files"][ROWS]))
                for name in dataset.files
            ]
            assert orders[0] == list(itertools.chain(*by_file))
    batch = next(iter(dataset.loader(8, shuffle=False, rank=0, size=1, columns=["id", "x"])))
    assert (batch["x"][:, 0].long() == batch["id"]).all()


def test_versions(table):
    path = table["path"]
    assert live_ids(path) == list(range(1000, 1100))
    latest = hora.data.from_delta(str(path))
    seen = step_world(world(latest, 2, True))
    assert sorted(itertools.chain(*seen)) == list(range(1000, 1100))
    assert not any(p.deleted for p in latest.pieces)
    first = hora.data.from_delta(path, version=0, columns=["id"])
    assert [c.name for c in first.columns] == ["id"] and len(first) == ROWS
    loaders = [first.loader(32, rank=r, size=3) for r in range(3)]
    assert sorted(itertools.chain(*step_world(loaders))) == list(range(ROWS))
    fingerprints = {latest.fingerprint, first.fingerprint}
    fingerprints.add(hora.data.from_delta(path, version=2).fingerprint)
    assert len(fingerprints) == 3
    assert hora.data.from_delta(path, version=2) == hora.data.from_delta(path, version=2)
    with pytest.raises(ValueError, match="version 9"):
        hora.data.from_delta(path, version=9)


def test_a_local_run_trains_only_live_rows(table):
    dataset = hora.data.from_delta(table["path"], version=2)
    results = hora.run(_jobs.ids_per_epoch, (dataset, 16, True, 2), np=2, backend="local")
    for epoch in range(2):
        ids = sorted(itertools.chain(*(r["ids"][epoch] for r in results)))
        assert ids == table["live"], epoch


def test_packed_deletions_stay_small():
    rows = 1_000_000
    run = np.zeros(rows, dtype=bool)
    run[100_000:900_000] = True
    scattered = np.zeros(rows, dtype=bool)
    scattered[::2] = True
    for mask, most in ((run, 1_000), (scattered, 2_000)):
        packed = pack_deleted(mask)
        assert len(packed) < most, len(packed)
        assert (kept_rows(packed, rows) == ~mask).all()
    assert pack_deleted(np.zeros(10, dtype=bool)) == b""
    assert kept_rows(b"", 3).all()


def mapped_table(path, mode: str, reader: int = 2, features=None):
    """A table in column mapping mode `mode`, its log and file written here: the file's columns
    have physical names ("col-1", "col-2"), the schema logical ones ("id", "x")."""
    (path / "_delta_log").mkdir(parents=True)
    data = ids_table(0, 40).select(["id", "x"]).rename_columns(["col-1", "col-2"])
    pq.write_table(data, path / "part-0.parquet", row_group_size=16)

    def field(name, kind, number):
        meta = {
            "delta.columnMapping.id": number,
            "delta.columnMapping.physicalName": f"col-{number}",
        }
        return {"name": name, "type": kind, "nullable": True, "metadata": meta}

    schema = {
        "type": "struct",
        "fields": [
            field("id", "long", 1),
            field("x", {"type": "array", "elementType": "float", "containsNull": True}, 2),
        ],
    }
    protocol = {"minReaderVersion": reader, "minWriterVersion": 7 if features else 5}
    if features:
        protocol |= {"readerFeatures": features, "writerFeatures": features}
    actions = [
        {"protocol": protocol},
        {
            "metaData": {
                "id": f"mapped-{mode}",
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(schema),
                "partitionColumns": [],
                "configuration": {
                    "delta.columnMapping.mode": mode,
                    "delta.columnMapping.maxColumnId": "2",
                },
                "createdTime": 0,
            }
        },
        {
            "add": {
                "path": "part-0.parquet",
                "partitionValues": {},
                "size": (path / "part-0.parquet").stat().st_size,
                "modificationTime": 0,
                "dataChange": True,
                "stats": json.dumps({"numRecords": 40}),
            }
        },
    ]
    lines = "".join(json.dumps(a) + "\n" for a in actions)
    (path / "_delta_log" / f"{0:020d}.json").write_text(lines)
    return path


def test_column_mapping_by_name_reads_physical_columns(tmp_path):
    path = mapped_table(tmp_path / "named", "name")
    assert pa.table(deltalake.DeltaTable(str(path)).scan()).column_names == ["id", "x"]
    dataset = hora.data.from_delta(path)
    assert dataset.renamed == {"id": "col-1", "x": "col-2"}
    assert [c.name for c in dataset.columns] == ["id", "x"]
    seen = step_world(world(dataset, 3, True, batch=4))
    assert sorted(itertools.chain(*seen)) == list(range(40))


def test_what_hora_cannot_read_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="column mapping mode 'id'"):
        hora.data.from_delta(mapped_table(tmp_path / "by-id", "id"))
    for feature in ("typeWidening", "madeUpFeature"):  # refused by hora, by deltalake
        features = ["columnMapping", feature]
        with pytest.raises(ValueError, match=feature):
            hora.data.from_delta(mapped_table(tmp_path / feature, "name", 3, features))
    nulls = tmp_path / "nulls"
    deltalake.write_deltalake(str(nulls), pa.table({"id": [1, 2, 3], "n": [1.0, None, 3.0]}))
    with pytest.raises(ValueError, match="column 'n' has 1 null rows"):
        hora.data.from_delta(nulls)
    assert len(hora.data.from_delta(nulls, columns=["id"])) == 3
    parted = tmp_path / "parted"
    data = ids_table(0, 60).append_column("k", pa.array([i % 3 for i in range(60)]))
    deltalake.write_deltalake(str(parted), data, partition_by=["k"])
    with pytest.raises(ValueError, match=r"\['k'\] are partition columns"):
        hora.data.from_delta(parted)
    dataset = hora.data.from_delta(parted, columns=["id", "x"])
    seen = step_world(world(dataset, 2, False))
    assert sorted(itertools.chain(*seen)) == list(range(60))
    with pytest.raises(ValueError, match=r"columns \['nope'\] are not in it"):
        hora.data.from_delta(parted, columns=["nope"])
    with pytest.raises(ValueError, match="cannot be opened"):
        hora.data.from_delta(tmp_path / "nothing here")
