"""The loader's way to the GPU, as far as a machine without one runs it: the thread that pins each
batch into a reused pool of buffers ahead of the loop, with a pageable buffer standing in for a
page-locked one. What only a GPU runs (page-locked memory, the side stream's copy, the loop's
stream waiting on its event) is tests/gpu/test_data_device.py's."""

from __future__ import annotations

import threading

import pytest
import torch

from hora.data import _device
from tests.data._parquet import write_ids

BATCH = 50  # 600 rows: 12 batches an epoch


@pytest.fixture
def stand_in_pinning(monkeypatch):
    """Pinning that this machine can do: the buffers `allocate` made, by size."""
    made: list[int] = []

    def allocate(nbytes: int):
        made.append(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8).untyped_storage()

    monkeypatch.setattr(_device, "can_pin", lambda: True)
    monkeypatch.setattr(_device, "pinned", allocate)
    return made


def loaders(dataset, **options):
    common = {"columns": ["id", "x"], "rank": 0, "size": 1, "num_workers": 0, **options}
    return dataset.loader(BATCH, **common), dataset.loader(BATCH, pin_memory=True, **common)


def same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_thread_gives_the_same_batches_into_buffers_it_reuses(tmp_path, stand_in_pinning):
    """100 epochs: the batches of the training thread, from a pool that stops growing once the
    loop's pace is known; batches the loop keeps are never written over; the position counts
    the batches the loop took, not those the thread made ahead."""
    plain, fed = loaders(write_ids(tmp_path))
    threads = []
    plain.set_epoch(0)
    fed.set_epoch(0)
    want = [{k: v.clone() for k, v in b.items()} for b in plain]
    kept = []
    for step, batch in enumerate(fed):
        threads += [t.name for t in threading.enumerate()]
        assert fed.state_dict()["consumed"] == (step + 1) * BATCH
        kept.append(batch)
    assert "hora-data-to-device" in threads
    bound = len(kept) + _device.DEPTH + _device.KEEP_FREE + 2  # kept, in flight, free
    for epoch in range(1, 100):
        plain.set_epoch(epoch)
        fed.set_epoch(epoch)
        for a, b in zip(plain, fed, strict=True):
            assert same(a, b), epoch
        assert fed._pinned().held <= bound, epoch
    # a buffer never found again would cost one a batch: 1,200 over these epochs
    assert len(stand_in_pinning) <= bound
    assert all(same(a, b) for a, b in zip(want, kept, strict=True))


def test_an_error_or_a_loop_left_early_ends_the_thread(tmp_path, stand_in_pinning):
    dataset = write_ids(tmp_path)

    def fails(batch):
        if 333 in batch["id"]:
            raise ValueError("row 333 is broken")
        return batch

    _, fed = loaders(dataset, transform=fails, shuffle=False)
    with pytest.raises(ValueError, match="row 333 is broken"):
        for _ in fed:
            pass
    _, fed = loaders(dataset)
    for step, _ in enumerate(fed):
        if step == 2:
            break
    assert fed.state_dict()["consumed"] == 3 * BATCH
    fed.set_epoch(1)
    assert sum(len(b["id"]) for b in fed) == 600
    # the thread is gone after each (tests/conftest.py fails a test that leaves one)
