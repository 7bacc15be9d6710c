"""The one atomic writer: a file appears under its name whole, or not at all.

On a local (or mounted) filesystem: a temp file in the same directory (so the rename never
crosses filesystems), flushed and fsynced (the bytes are on disk before the name points at
them), renamed over the name (the name appears whole), then the directory fsynced (the rename
itself survives a crash). On a pyarrow filesystem (HDFS, S3, GCS, ...): the same temp-then-move,
with what that filesystem makes atomic; pyarrow has no fsync, so the bytes are as durable as
closing the stream makes them there.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Callable
from typing import Any, BinaryIO

# A file being written is named `.<final name>.<pid>-<random>.tmp`: the leading dot and the suffix
# keep it out of every listing of finished files, and the pid says who left it behind.
TEMP_SUFFIX = ".tmp"

# Filesystems that cannot fsync a directory (some FUSE and network mounts) say so with these;
# there the rename is as durable as the filesystem makes it, and nothing more can be asked.
_NO_DIRECTORY_SYNC = {errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EACCES, errno.EPERM}


def temp_name(name: str) -> str:
    """A sibling name for a file being written: hidden (leading dot), `.tmp`, naming its pid."""
    return f".{name}.{os.getpid()}-{secrets.token_hex(4)}{TEMP_SUFFIX}"


def is_temp(name: str) -> bool:
    """Whether `name` is a file some writer was still writing (or died writing)."""
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def write_local(directory: str, name: str, write: Callable[[BinaryIO], Any]) -> None:
    """Have `write` fill `directory/name` on this machine's filesystem, atomically and durably."""
    os.makedirs(directory, exist_ok=True)
    temp = os.path.join(directory, temp_name(name))
    try:
        with open(temp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, os.path.join(directory, name))
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temp)
        raise
    sync_directory(directory)


def sync_directory(directory: str) -> None:
    """fsync a directory, so that a rename in it survives a crash (where the filesystem can)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in _NO_DIRECTORY_SYNC:
            raise
    finally:
        os.close(fd)


def write_arrow(filesystem: Any, parent: str, name: str, write: Callable[[Any], Any]) -> None:
    """Have `write` fill a temp file in `parent` through pyarrow, then move it over `name`."""
    temp = f"{parent.rstrip('/')}/{temp_name(name)}"
    final = f"{parent.rstrip('/')}/{name}"
    filesystem.create_dir(parent, recursive=True)  # made on the driver, used on an executor
    try:
        with filesystem.open_output_stream(temp) as out:
            write(out)
        try:
            filesystem.move(temp, final)
        except OSError:
            # Some filesystems (HDFS) refuse to move onto an existing file: the same name
            # written again. Remove the old one and move again.
            filesystem.delete_file(final)
            filesystem.move(temp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            filesystem.delete_file(temp)
        raise
