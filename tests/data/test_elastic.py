"""An elastic run on the local engine that grows from 1 to 2 ranks mid-epoch, with the loader's
position in TorchState and its batches made by a worker process: every row is trained once per
epoch across the resize."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import hora
from tests.data import _jobs
from tests.data._parquet import write_ids

ROWS = 600


def _grow_from_1_to_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[int]]:
    """Two epochs of `_jobs.elastic_ids` (a loader worker per rank) started at 1 rank with room
    for 2: the folder of its step logs, and what its ranks returned."""
    monkeypatch.setenv("HORA_ELASTIC_SETTLE_SECONDS", "1")
    dataset = write_ids(tmp_path / "data")
    folder = tmp_path / "logs"
    folder.mkdir()
    args = (dataset, str(folder), 2, 16, 1)
    worlds = hora.run(_jobs.elastic_ids, args, np=1, min_np=1, max_np=2, timeout=240)
    return folder, worlds


def test_a_run_resized_mid_epoch_trains_each_row_once_per_epoch(tmp_path, monkeypatch, capfd):
    # the restart path: the job reads its rank and size once, before hvd.elastic.run
    monkeypatch.setenv("HORA_ELASTIC_IN_PLACE", "0")
    folder, worlds = _grow_from_1_to_2(tmp_path, monkeypatch)
    assert worlds == [2, 2]
    attempts: dict[int, list[list[dict]]] = {}
    for path in sorted(Path(folder).glob("log-*.jsonl")):
        _, attempt, _rank = path.stem.split("-")
        attempts.setdefault(int(attempt), []).append(
            [json.loads(line) for line in path.read_text().splitlines()]
        )
    assert sorted(attempts) == [0, 1], sorted(attempts)
    # the first attempt's steps after the commit the second resumed from were rolled back
    resumed = min(e["commit"] for rank in attempts[1] for e in rank)
    kept = [e for e in attempts[0][0] if e["commit"] < resumed]
    kept += [e for rank in attempts[1] for e in rank]
    assert {e["world"] for e in attempts[0][0]} == {1}
    first_epoch = {e["epoch"] for e in attempts[1][0]}
    assert 0 in first_epoch, "the run did not grow mid-epoch (before epoch 0 ended)"
    for epoch in range(2):
        trained = Counter(i for e in kept if e["epoch"] == epoch for i in e["ids"])
        assert sorted(trained) == list(range(ROWS)) and set(trained.values()) == {1}, epoch
    assert "hora: resizing from 1 to 2 ranks" in capfd.readouterr().err


def test_a_run_grown_in_place_mid_epoch_with_workers_trains_each_row_once(
    tmp_path, monkeypatch, capfd
):
    """The same growth in place (the default): rank 0 keeps its process, and its loader's
    workers, while the world re-forms around it; the joiner's loader starts its own."""
    folder, _ = _grow_from_1_to_2(tmp_path, monkeypatch)
    logs = {
        path.stem: [json.loads(line) for line in path.read_text().splitlines()]
        for path in sorted(Path(folder).glob("log-*.jsonl"))
    }
    assert sorted(logs) == ["log-0-0", "log-0-1"], sorted(logs)  # one attempt: no restart
    assert logs["log-0-1"][0]["epoch"] == 0, "the run did not grow mid-epoch"
    for epoch in range(2):
        trained = Counter(
            i for entries in logs.values() for e in entries if e["epoch"] == epoch for i in e["ids"]
        )
        assert sorted(trained) == list(range(ROWS)) and set(trained.values()) == {1}, epoch
    assert "hora: growing in place from 1 to 2 ranks" in capfd.readouterr().err
