"""The loader's worker processes: the same batches as the training thread makes, each row once
per epoch at any world size, resume and resize, and what happens when a worker raises or dies,
or its rank dies (nothing left running, nothing left in /dev/shm). JPEGs made here, decoded by
the loader's transform in the workers."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

import hora.data
from hora.data import LoaderWorkerError
from tests.data._images import decode, write_jpegs
from tests.data._parquet import step_world

REPO = Path(__file__).resolve().parents[2]
IMAGES = 90
COLUMNS = ["id", "label", "image"]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return hora.data.from_parquet(write_jpegs(tmp_path_factory.mktemp("jpegs"), IMAGES))


def world(dataset, size, workers, batch=8, **options):
    options.setdefault("columns", COLUMNS)
    options.setdefault("transform", decode)
    options.setdefault("prefetch", 1 << 16)  # windows of one row group (~22 KB each)
    return [
        dataset.loader(batch, rank=r, size=size, num_workers=workers, **options)
        for r in range(size)
    ]


def batches(loader):
    return [{k: v.clone() for k, v in b.items()} for b in loader]


def closed(loaders):
    for loader in loaders:
        loader.close()


#: (shuffle, prefetch, batch): windows of one row group, batches of 24 KB (pickled back);
#: windows of all 6 (shuffled) or units of 2 (file order), batches across units, of 90 KB
#: (packed in the workers' shared-memory segments)
BATCHES_CASES = [(False, 1 << 16, 8), (True, 1 << 16, 8), (False, 1 << 20, 30), (True, 1 << 20, 30)]


@pytest.mark.parametrize(("shuffle", "prefetch", "batch"), BATCHES_CASES)
def test_workers_make_the_batches_the_training_thread_makes(images, shuffle, prefetch, batch):
    options = {"shuffle": shuffle, "prefetch": prefetch, "batch": batch}
    plain, parallel = world(images, 2, 0, **options), world(images, 2, 2, **options)
    try:
        for epoch in range(2):
            for loader in plain + parallel:
                loader.set_epoch(epoch)
            for a, b in zip(plain, parallel, strict=True):
                want, got = batches(a), batches(b)
                assert len(want) == len(got) == len(a)
                for x, y in zip(want, got, strict=True):
                    assert x.keys() == y.keys() == {"image", "id", "label"}
                    assert all(torch.equal(x[k], y[k]) for k in x)
                    assert y["image"].dtype == torch.uint8 and y["image"].shape[1:] == (32, 32, 3)
        # an iteration left half-way: the next one starts clean (its batches, not the old ones)
        loader = parallel[0]
        loader.set_epoch(5)
        iterator = iter(loader)
        next(iterator)
        del iterator
        loader.set_epoch(6)
        plain[0].set_epoch(6)
        assert [b["id"].tolist() for b in loader] == [b["id"].tolist() for b in plain[0]]
    finally:
        closed(parallel)


@pytest.mark.parametrize("size", [1, 2, 3])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_row_once_per_epoch_with_workers(images, size, shuffle):
    loaders = world(images, size, 2, shuffle=shuffle)
    try:
        for epoch in range(2):
            for loader in loaders:
                loader.set_epoch(epoch)
            seen = step_world(loaders)
            assert sorted(itertools.chain(*seen)) == list(range(IMAGES))
        assert all(len(loader.worker_pids) == 2 for loader in loaders)
    finally:
        closed(loaders)


def test_resume_and_resize_mid_epoch_with_workers(images):
    """2 ranks for 3 steps, a saved state resumed by 2 new ones (the uninterrupted order), and
    the same state split over 3 ranks: every row once."""
    whole = step_world(world(images, 2, 0))
    first_world = world(images, 2, 2)
    try:
        first = step_world(first_world, steps=3)
        state = first_world[0].state_dict()
        assert state == first_world[1].state_dict() and state["consumed"] == 3 * 8 * 2
    finally:
        closed(first_world)
    for size in (2, 3):
        again = world(images, size, 1)
        try:
            for loader in again:
                loader.load_state_dict(state)
            rest = step_world(again)
        finally:
            closed(again)
        assert sorted(itertools.chain(*first, *rest)) == list(range(IMAGES))
        if size == 2:
            assert [first[r] + rest[r] for r in range(2)] == whole


def failing(batch):
    if 37 in batch["id"]:
        raise ValueError("row 37 is not an image")
    return decode(batch)


def test_a_worker_that_raises_gives_its_traceback_and_row_groups(images):
    (loader,) = world(images, 1, 2, shuffle=False, transform=failing)
    try:
        with pytest.raises(LoaderWorkerError) as raised:
            for _ in loader:
                pass
        message = str(raised.value)
        assert "raised while making batch 4" in message
        assert "images.parquet row group 2" in message  # rows 32..47
        assert "ValueError: row 37 is not an image" in message and "in failing" in message
        # the workers are still there: the next epoch runs until the same row
        assert all(psutil.Process(p).is_running() for p in loader.worker_pids)
    finally:
        loader.close()


def slow(batch):
    time.sleep(0.1)
    return decode(batch)


def test_the_segment_names_a_killed_worker_left_are_removed_and_no_other(tmp_path):
    """torch names a new segment `torch_<pid>_...` and unlinks the name at once: a worker
    SIGKILLed in between leaves the name, which the loader's close removes by the pid."""
    from hora.data._shared import remove_names_left

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    left = [tmp_path / f"torch_{gone.pid}_1234_{n}" for n in (0, 1)]
    others = [tmp_path / f"torch_{gone.pid}1_1234_0", tmp_path / f"torch_{os.getpid()}_1_0"]
    for path in left + others:
        path.touch()
    remove_names_left(gone.pid, str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in others)
    remove_names_left(None, str(tmp_path))  # a worker that never started: nothing
    assert len(list(tmp_path.iterdir())) == 2


def test_a_killed_worker_fails_the_rank_and_ends_the_others(images):
    shm_before = set(os.listdir("/dev/shm"))
    (loader,) = world(images, 1, 2, transform=slow, batch=30, prefetch=1 << 20)
    iterator = iter(loader)
    next(iterator)
    pids = loader.worker_pids
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(LoaderWorkerError, match=r"worker 1 .* died \(killed by SIGKILL\)"):
        for _ in iterator:
            pass
    assert not [p for p in pids if psutil.pid_exists(p)]
    with pytest.raises(LoaderWorkerError, match="died"):
        next(iter(loader))  # and says so again, rather than hang
    loader.close()
    assert set(os.listdir("/dev/shm")) <= shm_before


def torch_segments() -> set[str]:
    """The torch shared-memory segments this process maps (their names, unlinked)."""
    with open("/proc/self/maps") as maps:
        return {line.split()[-2] for line in maps if "/torch_" in line and "(deleted)" in line}


def test_batch_segments_are_reused_and_never_while_a_batch_holds_them(images):
    """Batches of 90 KB come back in the workers' segments: 15 epochs map no more of them than
    the first few did, and batches kept by the loop (not cloned) keep their values while
    later epochs run."""
    options = {"batch": 30, "prefetch": 1 << 20, "seed": 3}
    (plain,) = world(images, 1, 0, **options)
    (loader,) = world(images, 1, 2, **options)
    try:
        plain.set_epoch(0)
        want = batches(plain)
        loader.set_epoch(0)
        kept = list(loader)  # the loader's own tensors, held across the epochs below
        for epoch in range(1, 16):
            loader.set_epoch(epoch)
            for _ in loader:
                pass
            if epoch == 5:
                after_five = torch_segments()
        assert torch_segments() <= after_five, "segments grew after epoch 5"
        assert len(after_five) <= 2 * 6, after_five  # per worker: in flight, held, kept free
        for x, y in zip(want, kept, strict=True):
            assert all(torch.equal(x[k], y[k]) for k in x)
    finally:
        loader.close()


def test_workers_end_with_their_rank_and_leave_no_shared_memory(images):
    shm_before = set(os.listdir("/dev/shm"))
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    path = images.location.location()
    rank = subprocess.Popen(
        [sys.executable, "-m", "tests.data._workers_rank", path],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    try:
        started = json.loads(rank.stdout.readline())
        workers = started["workers"]
        assert len(workers) == 2 and all(psutil.pid_exists(p) for p in workers)
        rank.send_signal(signal.SIGKILL)
        rank.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in workers if _alive(p)], "workers outlived their rank"
        assert set(os.listdir("/dev/shm")) <= shm_before
    finally:
        rank.kill()
        rank.wait()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_workers_checked_and_chosen(images, monkeypatch):
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="num_workers must be an int >= 0"):
            images.loader(4, columns=["id"], num_workers=bad, rank=0, size=1)
    assert images.loader(4, columns=["id"], rank=0, size=1).num_workers == 0
    with_transform = images.loader(4, columns=COLUMNS, transform=decode, rank=0, size=1)
    assert 1 <= with_transform.num_workers <= hora.data.MAX_DEFAULT_WORKERS
    # several ranks on a host split its cores: each its share less its own, at least one
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    place = {"RANK": "1", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "GROUP_RANK": "0"}
    place["GROUP_WORLD_SIZE"] = "2"
    for ranks_here, workers in ((1, 8), (2, 7), (4, 3), (8, 1), (16, 1)):
        for name, value in {**place, "LOCAL_WORLD_SIZE": str(ranks_here)}.items():
            monkeypatch.setenv(name, value)
        loader = images.loader(4, columns=COLUMNS, transform=decode, rank=0, size=1)
        assert loader.num_workers == workers, ranks_here


def test_pin_memory_without_cuda_warns_and_a_device_is_honoured(images):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: tests/gpu covers pinning and the copy")
    (loader,) = world(images, 1, 1, pin_memory=True, device="cpu")
    try:
        with pytest.warns(UserWarning, match="no CUDA device"):
            got = batches(loader)
        assert sorted(int(i) for b in got for i in b["id"]) == list(range(IMAGES))
        assert all(b["image"].device.type == "cpu" for b in got)
    finally:
        loader.close()


def test_text_and_numbers_through_workers_keep_their_types(tmp_path):
    """A transform that returns a list and a tensor: they arrive as they left, next to arrays."""
    from tests.data._parquet import write_ids

    dataset = write_ids(tmp_path)

    def mixed(batch):
        return {
            "text": batch["text"],
            "x": torch.as_tensor(np.array(batch["x"])) * 2,
            "id": batch["id"],
        }

    (plain,) = world(dataset, 1, 0, columns=["id", "x", "text"], transform=mixed)
    (parallel,) = world(dataset, 1, 2, columns=["id", "x", "text"], transform=mixed)
    try:
        for a, b in zip(plain.numpy_batches(), parallel.numpy_batches(), strict=True):
            assert a["text"] == b["text"] and isinstance(b["text"], list)
            assert torch.equal(a["x"], b["x"]) and isinstance(b["x"], torch.Tensor)
            assert isinstance(b["id"], np.ndarray) and np.array_equal(a["id"], b["id"])
    finally:
        parallel.close()
