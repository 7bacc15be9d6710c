"""The loader in one process: a world is several loaders with explicit rank and size, stepped in
lockstep. Exactly once per epoch, resume from a state, resize, the checks that name a column."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import hora.data
from hora.data import _order
from tests.data._parquet import step_world, write_ids

ROWS = 600


def world(dataset, size, batch=16, **options):
    options.setdefault("columns", ["id", "x"])
    return [dataset.loader(batch, rank=r, size=size, **options) for r in range(size)]


def test_order_arithmetic():
    assert _order.split([(0, 10)], 3) == [[(0, 4)], [(4, 7)], [(7, 10)]]
    assert _order.split([(0, 2), (5, 9)], 2) == [[(0, 2), (5, 6)], [(6, 9)]]
    # the same number of batches on every rank; every row given out, or none past full batches
    assert _order.batch_sizes([11, 10], 5, False) == [[5, 5, 1], [5, 4, 1]]
    assert _order.batch_sizes([11, 10], 5, True) == [[5, 5], [5, 5]]
    # no empty batch where a row can go elsewhere: one batch fewer, the last one larger
    assert _order.batch_sizes([3, 2], 1, False) == [[1, 2], [1, 1]]
    assert _order.batch_sizes([1, 0], 4, False) == [[1], [0]]
    assert _order.left_after([[(0, 4)], [(4, 8)]], [[2, 2], [2, 2]], 1) == [(2, 4), (6, 8)]
    windows = _order.windows(
        [3, 3, 3], [10, 10, 10], shuffle=True, seed=1, epoch=0, window_bytes=20
    )
    assert sorted(i for w in windows for i in w.pieces) == [0, 1, 2]
    assert [w.start for w in windows] == [0, *itertools.accumulate(w.rows for w in windows[:-1])]


@pytest.mark.parametrize("shuffle", [False, True])
def test_every_row_reaches_one_rank_once_per_epoch(tmp_path, shuffle):
    dataset = write_ids(tmp_path)
    loaders = world(dataset, 3, shuffle=shuffle, prefetch=1 << 16)
    orders = []
    for epoch in range(2):
        for loader in loaders:
            loader.set_epoch(epoch)
        seen = step_world(loaders)
        everything = sorted(itertools.chain(*seen))
        assert everything == list(range(ROWS))
        orders.append(list(itertools.chain(*seen)))
    assert (orders[0] == orders[1]) is (not shuffle)
    if not shuffle:
        assert orders[0] == list(range(ROWS))
    batch = next(iter(loaders[0]))
    assert batch["x"].shape == (16, 3) and batch["x"].dtype == torch.float32
    assert batch["id"].dtype == torch.int64


def test_a_loader_restored_mid_epoch_yields_exactly_the_remaining_rows(tmp_path):
    dataset = write_ids(tmp_path)
    loaders = world(dataset, 2, prefetch=1 << 16)
    first = step_world(loaders, steps=5)
    state = pickle.loads(pickle.dumps(loaders[0].state_dict()))
    assert state == loaders[1].state_dict()  # the same on every rank
    assert state["consumed"] == 5 * 16 * 2
    again = world(dataset, 2, prefetch=1 << 16)
    for loader in again:
        loader.load_state_dict(state)
        loader.set_epoch(0)  # the epoch under way keeps its position
    rest = step_world(again)
    done = list(itertools.chain(*first, *rest))
    assert sorted(done) == list(range(ROWS))
    # and the rows come in the order the uninterrupted run gives them, rank by rank
    whole = step_world(world(dataset, 2, prefetch=1 << 16))
    assert [first[r] + rest[r] for r in range(2)] == whole
    # the next iteration starts epoch 1
    assert sorted(itertools.chain(*step_world(again))) == list(range(ROWS))
    assert again[0].epoch == 1


def test_a_commit_after_an_epochs_last_batch_resumes_with_nothing_left_of_it(tmp_path):
    """The elastic loop's commit can fall after the epoch's last batch and before its epoch
    counter moves on: resumed there, `set_epoch(same epoch)` must train none of it again (it
    started the epoch over: every row twice), and the next epoch comes whole."""
    dataset = write_ids(tmp_path)
    loaders = world(dataset, 2, prefetch=1 << 16)
    for loader in loaders:
        loader.set_epoch(0)
    assert sorted(itertools.chain(*step_world(loaders))) == list(range(ROWS))
    state = loaders[0].state_dict()
    assert (state["epoch"], state["remaining"], state["consumed"]) == (0, [], ROWS)
    again = world(dataset, 2, prefetch=1 << 16)
    for loader in again:
        loader.load_state_dict(state)
        loader.set_epoch(0)  # the loop's epoch counter had not moved on
        assert len(loader) == 0
    assert step_world(again) == [[], []]
    for loader in again:
        loader.set_epoch(1)
    assert sorted(itertools.chain(*step_world(again))) == list(range(ROWS))
    assert again[0].epoch == 1
    # an epoch the loader itself ran to its end starts again (a validation pass each epoch)
    for loader in again:
        loader.set_epoch(1)
    assert sorted(itertools.chain(*step_world(again))) == list(range(ROWS))


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_resize_mid_epoch_trains_each_row_once(tmp_path, shuffle):
    """4 ranks, then 2 from the state of the 4, then 3, within one epoch; then a full epoch."""
    dataset = write_ids(tmp_path)
    done: list[int] = []
    state = None
    for size, steps in ((4, 3), (2, 4), (3, None)):
        loaders = world(dataset, size, batch=8, shuffle=shuffle, prefetch=1 << 16)
        for loader in loaders:
            if state is not None:
                loader.load_state_dict(state)
        seen = step_world(loaders, steps)
        done += itertools.chain(*seen)
        state = loaders[0].state_dict()
    assert sorted(done) == list(range(ROWS))
    assert state is not None and state["remaining"] == [] and state["consumed"] == ROWS


def test_drop_last_gives_full_batches_only(tmp_path):
    dataset = write_ids(tmp_path)
    loaders = world(dataset, 3, batch=64, drop_last=True, prefetch=1 << 16)
    assert [len(loader) for loader in loaders] == [3, 3, 3]
    seen = step_world(loaders)
    assert all(len(s) == 3 * 64 for s in seen)
    assert len(set(itertools.chain(*seen))) == 3 * 3 * 64


def test_uneven_shares_keep_ranks_in_lockstep(tmp_path):
    dataset = write_ids(tmp_path, files=1, rows=23, group=5)
    for batch in (4, 1):
        loaders = world(dataset, 4, batch=batch)
        seen = step_world(loaders)
        assert sorted(itertools.chain(*seen)) == list(range(23))


def test_transform_decodes_text_and_state_must_match(tmp_path):
    dataset = write_ids(tmp_path)

    def transform(batch):
        return {"n": np.array([int(t.split()[1]) for t in batch["text"]]), "id": batch["id"]}

    (loader,) = world(dataset, 1, columns=["id", "text"], transform=transform)
    batch = next(iter(loader))
    assert torch.equal(batch["n"], batch["id"])
    with pytest.raises(ValueError, match="build the loader as it was"):
        world(dataset, 1, seed=5)[0].load_state_dict(loader.state_dict())


def _write(path, table):
    pq.write_table(table, path)
    return hora.data.from_parquet(path)


def test_columns_that_cannot_become_tensors_are_named(tmp_path):
    dataset = write_ids(tmp_path / "ids")
    with pytest.raises(hora.data.ColumnError, match=r"\['text'\] hold text or bytes.*transform="):
        dataset.loader(4, rank=0, size=1)
    with pytest.raises(ValueError, match="not in the dataset"):
        dataset.loader(4, columns=["nope"], rank=0, size=1)
    with pytest.raises(ValueError, match="2 rows for 3 ranks"):
        write_ids(tmp_path / "tiny", files=1, rows=2).loader(4, columns=["id"], rank=0, size=3)
    cases = {
        "map": (pa.array([[("a", 1)]], pa.map_(pa.string(), pa.int64())), "is a map"),
        "struct": (pa.array([{"a": 1}]), "is a struct"),
        "nested": (pa.array([[[1.0]]]), "arrays of list"),
        "stamp": (pa.array([0], pa.timestamp("us")), "cast it to a number"),
    }
    for name, (values, message) in cases.items():
        with pytest.raises(hora.data.ColumnError, match=f"column '{name}'.*{message}"):
            _write(tmp_path / f"{name}.parquet", pa.table({name: values}))


def test_nulls_and_ragged_arrays_are_named_or_padded(tmp_path):
    nulls = _write(tmp_path / "nulls.parquet", pa.table({"v": pa.array([1.0, None, 3.0])}))
    with pytest.raises(hora.data.ColumnError, match=r"column 'v' has 1 null rows.*fillna"):
        next(iter(nulls.loader(3, shuffle=False, rank=0, size=1)))
    ragged = _write(tmp_path / "ragged.parquet", pa.table({"a": pa.array([[1.0], [1.0, 2.0]])}))
    with pytest.raises(hora.data.ColumnError, match=r"column 'a' holds arrays of 1 to 2.*pad="):
        next(iter(ragged.loader(2, shuffle=False, rank=0, size=1)))
    batch = next(iter(ragged.loader(2, shuffle=False, rank=0, size=1, pad={"a": 3})))
    assert batch["a"].tolist() == [[1.0, 0.0, 0.0], [1.0, 2.0, 0.0]]


def test_a_dataset_is_small_and_picklable(tmp_path):
    dataset = write_ids(tmp_path)
    assert len(pickle.dumps(dataset)) < 10_000
    assert pickle.loads(pickle.dumps(dataset)) == dataset and len(dataset) == ROWS
    dataset.delete()
    assert not tmp_path.exists()


def test_a_store_that_is_not_one_place_is_refused(tmp_path):
    """What the driver finds must be what Spark wrote; a store that cannot be written is named."""
    from hora.data._spark import _described
    from hora.storage import Location

    dataset = write_ids(tmp_path / "ids")
    with pytest.raises(ValueError, match=r"Spark wrote 601 rows.*finds 600.*one place"):
        _described(Location.parse(tmp_path / "ids"), "", list(dataset.columns), {}, 601)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"store .* cannot be written"):
        Location.parse(tmp_path / "file" / "store").check_writable()


def test_files_this_host_does_not_find_are_refused_before_any_batch(tmp_path):
    """A loader checks that its host reaches every file (by listing the folder when there are
    many), naming the host; the 2-host cluster refuses a path one host lacks
    (tests/cluster/test_spark.py)."""
    import socket

    from hora.data import _files

    dataset = write_ids(tmp_path / "ids")
    (tmp_path / "ids" / "part-1.parquet").unlink()
    host = socket.gethostname()
    for listed in (64, 1):  # a question per file, and one listing of the folder
        _files._ASKED_ONE_BY_ONE = listed
        try:
            with pytest.raises(FileNotFoundError) as refused:
                dataset.loader(8, columns=["id"], rank=1, size=2)
        finally:
            _files._ASKED_ONE_BY_ONE = 64
        assert f"rank 1 on host {host!r} does not find 1 of the dataset's 3 files" in str(
            refused.value
        )
        assert "'part-1.parquet'" in str(refused.value)


def test_footers_of_remote_files_are_read_at_once(tmp_path):
    """Footers behind a round trip (an object store's: here 20 ms a call) are read several at
    a time, and come back in order, each file's or the error it raised."""
    from hora.data import _footers
    from tests.data._parquet import slow_files

    write_ids(tmp_path / "ids", files=6)
    paths = [str(tmp_path / "ids" / f"part-{f}.parquet") for f in range(6)]
    paths.insert(3, str(tmp_path / "ids" / "none.parquet"))
    calls: list[int] = []
    found = _footers.read_footers(slow_files(0.02, calls), paths, ["id"])
    assert max(calls) > 1, calls  # calls overlapped
    assert isinstance(found[3], FileNotFoundError)
    del paths[3], found[3]
    from pyarrow import fs

    assert found == _footers.read_footers(fs.LocalFileSystem(), paths, ["id"])  # one by one
    assert [[rows for rows, _ in f.groups] for f in found] == [[32] * 6 + [8]] * 6
