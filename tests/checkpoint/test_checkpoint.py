"""hora.checkpoint on real files: round trip, step order, pruning, torn files, bad input, a writer
killed mid-save, and a real 2-rank job in which only rank 0 can see the directory."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest
import torch

import hora
from hora.checkpoint import Checkpoint, CheckpointLoadError, Restored, _format
from tests.checkpoint import _cases as _checkpoint_cases

RANK_VARS = ("RANK", "HOROVOD_RANK", "WORLD_SIZE", "HOROVOD_SIZE")


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    """Tests in this process are a world of one unless they say otherwise."""
    for name in RANK_VARS:
        monkeypatch.delenv(name, raising=False)


def names(directory) -> list[str]:
    return sorted(os.listdir(directory))


def small(step: int) -> dict:
    return {"w": torch.full((4,), float(step)), "step": step}


def test_round_trip_restores_model_optimizer_rng_and_history(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    random.seed(7)
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "epoch": 2,
        "step": 40,
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "history": [{"epoch": 1, "loss": 0.5}, {"epoch": 2, "loss": 0.25}],
    }
    expected_torch, expected_python = torch.rand(3), random.random()

    path = Checkpoint(tmp_path).save(state, 40)
    assert path == str(tmp_path / "step-40.ckpt")
    found = Checkpoint(tmp_path).latest()
    assert isinstance(found, Restored) and found.step == 40

    restored = torch.nn.Linear(3, 2)
    restored.load_state_dict(found.state["model"])
    assert all(
        torch.equal(a, b) for a, b in zip(restored.parameters(), model.parameters(), strict=True)
    )
    restored_opt = torch.optim.SGD(restored.parameters(), lr=0.1, momentum=0.9)
    restored_opt.load_state_dict(found.state["optimizer"])
    buf = restored_opt.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(buf, opt.state_dict()["state"][0]["momentum_buffer"])
    torch.set_rng_state(found.state["torch_rng"])
    random.setstate(found.state["python_rng"])
    assert torch.equal(torch.rand(3), expected_torch) and random.random() == expected_python
    assert found.state["history"] == state["history"] and found.state["epoch"] == 2


def test_no_checkpoint_is_none(tmp_path):
    assert Checkpoint(tmp_path / "new").latest() is None
    assert (tmp_path / "new").is_dir()  # rank 0 creates it up front, so a bad path fails early


def test_newest_is_the_highest_step_not_the_last_name_or_write(tmp_path):
    ckpt = Checkpoint(tmp_path, keep=10)
    for step in (9, 100, 10):  # "9" sorts after "100" and "10" as text; 10 is written last
        ckpt.save(small(step), step)
    found = ckpt.latest()
    assert found is not None and found.step == 100 and found.state["step"] == 100


def test_keep_removes_the_oldest_once_the_new_one_is_whole(tmp_path):
    ckpt = Checkpoint(tmp_path, keep=2)
    for step in range(1, 12):
        ckpt.save(small(step), step)
    assert names(tmp_path) == ["step-10.ckpt", "step-11.ckpt"]
    Checkpoint(tmp_path, keep=1).save(small(12), 12)
    assert names(tmp_path) == ["step-12.ckpt"]


def test_saving_a_step_again_replaces_it(tmp_path):
    ckpt = Checkpoint(tmp_path)
    ckpt.save(small(1), 5)
    ckpt.save(small(2), 5)
    found = ckpt.latest()
    assert found is not None and found.state["step"] == 2 and names(tmp_path) == ["step-5.ckpt"]


def test_pruning_leaves_steps_above_the_one_saved(tmp_path):
    # A run that resumed from step 5 (its step 10 damaged) must not lose what it saves now.
    ckpt = Checkpoint(tmp_path, keep=1)
    ckpt.save(small(10), 10)
    os.truncate(tmp_path / "step-10.ckpt", 100)
    ckpt.save(small(5), 5)
    ckpt.save(small(6), 6)
    assert names(tmp_path) == ["step-10.ckpt", "step-6.ckpt"]
    with pytest.warns(RuntimeWarning, match="step-10.ckpt"):
        found = ckpt.latest()
    assert found is not None and found.step == 6


def _truncate_in_payload(path):
    os.truncate(path, os.path.getsize(path) // 2)


def _truncate_in_footer(path):
    os.truncate(path, os.path.getsize(path) - 3)


def _empty(path):
    os.truncate(path, 0)


def _flip_a_payload_byte(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 3)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))


def _corrupt_the_stored_checksum(path):
    with open(path, "r+b") as f:
        f.seek(-(8 + 4), os.SEEK_END)  # the CRC-32 sits just before the 8-byte magic
        crc = f.read(4)
        f.seek(-4, os.SEEK_CUR)
        f.write(bytes(b ^ 0xFF for b in crc))


def _append_junk(path):
    with open(path, "ab") as f:
        f.write(b"junk")


def _rename_to_step_3(path):
    os.replace(path, os.path.join(os.path.dirname(path), "step-3.ckpt"))


DAMAGE = {
    "truncated in the state": (_truncate_in_payload, "no footer"),
    "truncated in the footer": (_truncate_in_footer, "no footer"),
    "empty": (_empty, "too short"),
    "a flipped byte": (_flip_a_payload_byte, "checksum mismatch"),
    "a corrupt checksum": (_corrupt_the_stored_checksum, "checksum mismatch"),
    "bytes appended": (_append_junk, "no footer"),
    "renamed to another step": (_rename_to_step_3, "holds step 2"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_newest_checkpoint_is_skipped_for_the_previous_one(tmp_path, damage):
    ckpt = Checkpoint(tmp_path)
    ckpt.save(small(1), 1)
    ckpt.save({"w": torch.randn(50_000), "step": 2}, 2)
    spoil, reason = DAMAGE[damage]
    spoil(str(tmp_path / "step-2.ckpt"))
    with pytest.warns(RuntimeWarning, match=reason):
        found = ckpt.latest()
    assert found is not None and found.step == 1 and torch.equal(found.state["w"], small(1)["w"])


def test_every_checkpoint_damaged_is_none(tmp_path):
    ckpt = Checkpoint(tmp_path)
    ckpt.save(small(1), 1)
    _truncate_in_payload(str(tmp_path / "step-1.ckpt"))
    with pytest.warns(RuntimeWarning):
        assert ckpt.latest() is None


def test_a_temp_file_is_never_read_and_the_next_save_removes_it(tmp_path):
    ckpt = Checkpoint(tmp_path)
    ckpt.save(small(1), 1)
    # A whole, valid file under a temp name: a writer killed between fsync and rename.
    whole = tmp_path / ".step-2.ckpt.999-abcd.tmp"
    with open(whole, "wb") as f:
        _format.write(small(2), 2, f)
    (tmp_path / ".step-3.ckpt.998-beef.tmp").write_bytes(b"half a checkpoint")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a temp file is not even worth a warning
        found = ckpt.latest()
    assert found is not None and found.step == 1
    ckpt.save(small(4), 4)
    assert names(tmp_path) == ["step-1.ckpt", "step-4.ckpt"]


def test_unpicklable_under_weights_only_raises_instead_of_falling_back(tmp_path):
    # A whole file that torch's safe loader refuses is the user's choice to make, not damage.
    ckpt = Checkpoint(tmp_path)
    ckpt.save(small(1), 1)
    ckpt.save({"numpy_rng": np.random.get_state()}, 2)
    with pytest.raises(Exception, match="weights_only"):
        ckpt.latest()
    found = ckpt.latest(weights_only=False)
    assert found is not None and found.step == 2 and found.state["numpy_rng"][0] == "MT19937"


def test_large_state_round_trips_bitwise(tmp_path):
    big = torch.randn(4 * 1024 * 1024)  # 16 MB: several read chunks, one torch record
    Checkpoint(tmp_path).save({"big": big}, 1)
    found = Checkpoint(tmp_path).latest()
    assert found is not None and torch.equal(found.state["big"], big)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_gpu_checkpoint_loads_on_the_cpu_unless_asked(tmp_path):
    Checkpoint(tmp_path).save({"w": torch.ones(3, device="cuda")}, 1)
    found = Checkpoint(tmp_path).latest()
    assert found is not None and found.state["w"].device.type == "cpu"
    found = Checkpoint(tmp_path).latest(map_location=None)
    assert found is not None and found.state["w"].is_cuda


def test_file_uri_is_the_local_path(tmp_path):
    ckpt = Checkpoint(f"file://{tmp_path}/uri")
    assert ckpt.directory == str(tmp_path / "uri")
    ckpt.save(small(3), 3)
    found = Checkpoint(tmp_path / "uri").latest()
    assert found is not None and found.step == 3


def test_pyarrow_filesystem(tmp_path):
    fs = pytest.importorskip("pyarrow.fs")
    ckpt = Checkpoint(str(tmp_path / "arrow"), keep=2, filesystem=fs.LocalFileSystem())
    for step in (1, 2, 3):
        ckpt.save(small(step), step)
    assert names(tmp_path / "arrow") == ["step-2.ckpt", "step-3.ckpt"]
    _truncate_in_payload(str(tmp_path / "arrow" / "step-3.ckpt"))
    with pytest.warns(RuntimeWarning, match="no footer"):
        found = ckpt.latest()
    assert found is not None and found.step == 2
    # A URI that is not file: goes to pyarrow; mock:// is pyarrow's own in-memory filesystem.
    memory = Checkpoint("mock:///checkpoints", keep=1)
    memory.save(small(7), 7)
    memory.save(small(8), 8)
    found = memory.latest()
    assert found is not None and found.step == 8


def test_other_ranks_neither_write_nor_touch_the_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    unreachable = tmp_path / "a-file"
    unreachable.write_text("")
    ckpt = Checkpoint(unreachable / "checkpoints")  # rank 0 would refuse this path
    assert ckpt.save(small(1), 1) is None
    assert unreachable.read_text() == ""
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("HOROVOD_RANK", "2")  # horovodrun's name for it
    assert Checkpoint(tmp_path / "h").save(small(1), 1) is None
    assert not (tmp_path / "h").exists()


@pytest.mark.parametrize("keep", [0, -1, True, 2.5, "3"])
def test_bad_keep(tmp_path, keep):
    with pytest.raises(ValueError, match="keep must be an int >= 1"):
        Checkpoint(tmp_path, keep=keep)


@pytest.mark.parametrize("step", [-1, 1.0, "3", None])
def test_bad_step(tmp_path, step):
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        Checkpoint(tmp_path).save(small(0), step)
    assert names(tmp_path) == []


def test_directory_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        Checkpoint(tmp_path / "f")


def test_directory_that_cannot_be_written(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OSError, match="cannot be written"):
        Checkpoint(tmp_path / "f" / "below")  # under a regular file: even root cannot create it
    readonly = tmp_path / "ro"
    readonly.mkdir(mode=0o500)
    if os.geteuid() != 0:  # root writes anywhere the filesystem allows
        with pytest.raises(OSError, match="cannot be written"):
            Checkpoint(readonly)


@pytest.mark.parametrize(
    ("directory", "message"),
    [("", "non-empty"), ("file://otherhost/x", "not on host 'otherhost'")],
)
def test_bad_directory_names(directory, message):
    with pytest.raises(ValueError, match=message):
        Checkpoint(directory)


def test_bad_rank_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ValueError, match="RANK='zero' is not an integer"):
        Checkpoint(tmp_path)


def test_load_and_broadcast_needs_connected_ranks(tmp_path, monkeypatch):
    Checkpoint(tmp_path).save(small(1), 1)
    found = Checkpoint(tmp_path).load_and_broadcast()  # a world of one: just latest()
    assert found is not None and found.step == 1
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match=r"call hvd.init\(\)"):
        Checkpoint(tmp_path).load_and_broadcast()


# The child freezes itself the moment its checkpoint file reaches LIMIT bytes: RLIMIT_FSIZE makes
# the kernel raise SIGXFSZ there, and its handler is libc's pause(). So the SIGKILL lands
# mid-write every time, however loaded the machine is, with LIMIT bytes of the state on disk.
LIMIT = 4 * 1024 * 1024
WRITER = textwrap.dedent(
    f"""
    import ctypes, resource, signal, sys
    import torch
    from hora.checkpoint import Checkpoint

    ckpt = Checkpoint(sys.argv[1])
    ckpt.save({{"w": torch.ones(4)}}, 1)
    libc = ctypes.CDLL(None)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal(signal.SIGXFSZ, ctypes.cast(libc.pause, ctypes.c_void_p))
    resource.setrlimit(resource.RLIMIT_FSIZE, ({LIMIT}, resource.RLIM_INFINITY))
    ckpt.save({{"w": torch.zeros(8 * 1024 * 1024)}}, 2)  # 32 MB
    print("the save finished", flush=True)
    """
)


def sizes(directory) -> dict[str, int]:
    """Each file's size; a temp file renamed or removed while we look is simply not there."""
    found = {}
    for entry in os.scandir(directory):
        with contextlib.suppress(FileNotFoundError):
            found[entry.name] = entry.stat().st_size
    return found


def test_a_writer_killed_mid_save_leaves_the_previous_checkpoint(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        frozen = []
        while not frozen and proc.poll() is None and time.monotonic() < deadline:
            frozen = [n for n, size in sizes(tmp_path).items() if size == LIMIT]
            time.sleep(0.01)
        assert proc.poll() is None, f"the writer ended on its own: {proc.stdout.read()!r}"
        assert frozen, "the writer never reached the size limit"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert frozen[0].startswith(".step-2.ckpt.") and frozen[0].endswith(".tmp")
    assert names(tmp_path) == sorted(["step-1.ckpt", frozen[0]])

    ckpt = Checkpoint(tmp_path)
    found = ckpt.latest()
    assert found is not None and found.step == 1 and torch.equal(found.state["w"], torch.ones(4))
    ckpt.save(small(2), 2)
    assert names(tmp_path) == ["step-1.ckpt", "step-2.ckpt"]


@pytest.fixture(scope="module")
def two_rank_job(tmp_path_factory):
    """One real 2-rank job runs every multi-rank case; (its directory, each rank's outcomes)."""
    root = tmp_path_factory.mktemp("two-ranks")
    (root / "a-file").write_text("")
    hidden = str(root / "a-file" / "checkpoints")  # cannot exist: rank 1 must not touch it
    from_driver = Checkpoint(root / "driver")
    return root, hora.run(_checkpoint_cases.run, args=(str(root), hidden, from_driver), np=2)


@pytest.fixture
def two_rank_outcome(two_rank_job):
    return two_rank_job[1]


def test_two_ranks_only_rank_zero_sees_the_directory(two_rank_job):
    tmp_path, (zero, one) = two_rank_job

    assert zero["from driver save"] == str(tmp_path / "driver" / "step-5.ckpt")
    assert one["from driver save"] is None
    assert names(tmp_path / "driver") == ["step-5.ckpt"]

    assert zero["env save"] == str(tmp_path / "env-rank0" / "step-1.ckpt")
    assert one["env save"] is None
    assert (zero["env dir exists"], one["env dir exists"]) == (True, False)

    rank0_step3 = (3, 0, [3.0, 3.0, 3.0])
    assert zero["dist empty"] is None and one["dist empty"] is None
    assert zero["dist loaded"] == one["dist loaded"] == rank0_step3
    assert names(tmp_path / "dist") == ["step-2.ckpt", "step-3.ckpt"]

    assert zero["hvd empty"] is None and one["hvd empty"] is None
    assert (zero["hvd save 10"], one["hvd save 10"]) == (True, False)
    assert zero["hvd loaded"] == one["hvd loaded"] == (10, 0, [10.0, 10.0, 10.0])

    assert zero["hvd unreadable"] == "raised UnpicklingError"
    assert one["hvd unreadable"] == f"raised {CheckpointLoadError.__name__}"
    assert zero["hvd unreadable, trusted"] == one["hvd unreadable, trusted"] == (11, 0, [0.0])


def test_two_ranks_resume_by_hand_as_the_readme_shows(two_rank_outcome):
    zero, one = two_rank_outcome
    # (same weights as the uninterrupted run, steps before the stop, steps after the resume)
    assert zero["resume by hand"] == one["resume by hand"] == (True, 6, 4)
