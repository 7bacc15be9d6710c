"""hora.storage.Location: one face for every place hora keeps files, local or on pyarrow."""

from __future__ import annotations

import os
import pickle

import pytest

from hora.storage import Location, NotWritableError, _atomic, is_temp


def places(tmp_path):
    """The same kind of place two ways: on this machine's disk, and through pyarrow's memory
    filesystem (mock://), which stands for HDFS, S3 and the other stores not mounted here."""
    fs = pytest.importorskip("pyarrow.fs")
    return [
        Location.parse(tmp_path / "local", "test place"),
        Location.parse(
            "/arrow-root", "test place", filesystem=fs.FileSystem.from_uri("mock:///")[0]
        ),
    ]


@pytest.mark.parametrize("which", [0, 1], ids=["local", "pyarrow"])
def test_write_list_read_remove(tmp_path, which):
    place = places(tmp_path)[which]
    place.check_writable()
    assert place.names() == [] and place.exists()
    place.write_bytes("a.bin", b"one")
    place.write_bytes("a.bin", b"two")  # replaced whole
    place.write_bytes("runs/r1/model/m.pkl", b"deep")  # folders made on the way
    assert place.read_bytes("a.bin") == b"two"
    assert place.read_bytes("runs/r1/model/m.pkl") == b"deep"
    assert sorted(place.names()) == ["a.bin", "runs"]
    assert place.names("runs/r1/model") == ["m.pkl"]
    with place.open_read("a.bin") as (f, size):
        assert size == 3 and f.read() == b"two"
    assert not any(is_temp(n) for n in place.names())
    place.remove("a.bin")
    place.remove("a.bin")  # already gone: not an error
    assert not place.exists("a.bin")
    place.remove_tree("runs")
    assert place.names() == []
    assert place.child("x", "y").describe() == place.describe("x/y")


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path):
    for place in places(tmp_path):
        place.write_bytes("f", b"old")

        def half(out):
            out.write(b"ne")
            raise RuntimeError("writer died")

        with pytest.raises(RuntimeError, match="writer died"):
            place.write_atomically("f", half)
        assert place.read_bytes("f") == b"old"
        assert place.names() == ["f"]


def test_local_writes_fsync_the_file_and_its_directory(tmp_path, monkeypatch):
    synced = []
    real = os.fsync

    def fsync(fd):
        synced.append(os.path.isdir(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(_atomic.os, "fsync", fsync)
    Location.parse(tmp_path).write_bytes("f", b"x")
    assert synced == [False, True]  # the file's bytes first, then the rename in its directory


def test_refusals_say_what_to_change(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotWritableError, match="is a file, not a directory"):
        Location.parse(tmp_path / "f", "Checkpoint directory").check_writable()
    with pytest.raises(OSError, match=r"Checkpoint directory .* cannot be written"):
        Location.parse(tmp_path / "f" / "below", "Checkpoint directory").check_writable()
    with pytest.raises(ValueError, match="cannot be written"):  # both an OSError and a ValueError
        Location.parse(tmp_path / "f" / "below").check_writable()
    with pytest.raises(ValueError, match="store must be a non-empty path"):
        Location.parse("")
    with pytest.raises(ValueError, match="not on host 'otherhost'"):
        Location.parse("file://otherhost/x")


def test_parsing_and_pickling(tmp_path):
    uri = Location.parse(f"file://{tmp_path}/a")
    assert uri.is_local and uri.local == str(tmp_path / "a")
    assert uri.spark_location("b") == f"file://{tmp_path}/a/b"
    remote = Location.parse("hdfs://namenode:8020/data")
    assert not remote.is_local and remote.location("x") == "hdfs://namenode:8020/data/x"
    assert pickle.loads(pickle.dumps(uri)) == uri
