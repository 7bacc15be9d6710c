"""A directory of whole files, local or on a pyarrow filesystem: list, write atomically, read,
remove. The checkpoint logic above it never sees a path separator or a URI."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, Protocol

from hora.storage._location import Location, move_into_place, temp_name

# Filesystems that cannot fsync a directory (some FUSE and network mounts) say so with these;
# there the rename is as durable as the filesystem makes it, and nothing more can be asked.
_NO_DIRECTORY_SYNC = {errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EACCES, errno.EPERM}


class Directory(Protocol):
    """A directory of files, local or remote."""

    def describe(self, name: str | None = None) -> str:
        """The directory (or one file in it) as the user would write it, for messages."""
        ...

    def prepare(self) -> None:
        """Create the directory if needed and prove it can be written; raise saying why not."""
        ...

    def names(self) -> list[str]:
        """Every file name in the directory; none when it does not exist yet."""
        ...

    def write_atomically(self, name: str, write: Callable[[BinaryIO], Any]) -> None:
        """Have `write` fill a temporary file, then make it appear as `name` all at once."""
        ...

    def open_read(self, name: str) -> contextlib.AbstractContextManager[tuple[BinaryIO, int]]:
        """A seekable binary file and its size."""
        ...

    def remove(self, name: str) -> None:
        """Remove a file; one already gone is not an error."""
        ...


def open_directory(
    place: str | os.PathLike[str], filesystem: Any = None, what: str = "directory"
) -> Directory:
    """The directory for a path, a `file:` URI, or (with pyarrow) any URI pyarrow can open;
    with `filesystem`, `place` is a path on that pyarrow filesystem."""
    if filesystem is not None:
        return ArrowDirectory(filesystem, os.fspath(place), what=what)
    location = Location.parse(place, what)
    if location.is_local:
        return LocalDirectory(location.local, what)
    filesystem, path = location.arrow()
    return ArrowDirectory(filesystem, path, location.uri, what)


def _unwritable(what: str, where: str, e: OSError) -> OSError:
    return OSError(
        e.errno,
        f"{what} {where!r} cannot be written ({e.strerror or e}); "
        "give a directory this process may create files in",
    )


def _is_a_file(what: str, where: str) -> ValueError:
    return ValueError(
        f"{what} {where!r} is a file, not a directory; "
        "give a directory path (it is created if missing)"
    )


class LocalDirectory:
    """A directory on this machine's filesystem: a local disk, NFS, a /dbfs-style FUSE mount.

    Temp file in the same directory (so the rename never crosses filesystems), flush and fsync
    (the bytes are on disk before the name points at them), rename (the name appears whole),
    fsync of the directory (the rename itself survives a crash).
    """

    def __init__(self, path: str, what: str = "directory") -> None:
        self.path = os.path.abspath(os.path.expanduser(path))
        self.what = what

    def describe(self, name: str | None = None) -> str:
        return self.path if name is None else os.path.join(self.path, name)

    def prepare(self) -> None:
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise _is_a_file(self.what, self.path)
        try:
            os.makedirs(self.path, exist_ok=True)
            probe = os.path.join(self.path, temp_name("probe"))
            with open(probe, "xb"):
                pass
            os.remove(probe)
        except OSError as e:
            raise _unwritable(self.what, self.path, e) from e

    def names(self) -> list[str]:
        try:
            return os.listdir(self.path)
        except FileNotFoundError:
            return []

    def write_atomically(self, name: str, write: Callable[[BinaryIO], Any]) -> None:
        os.makedirs(self.path, exist_ok=True)
        temp = os.path.join(self.path, temp_name(name))
        try:
            with open(temp, "xb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, os.path.join(self.path, name))
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(temp)
            raise
        self._sync_directory()

    def _sync_directory(self) -> None:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        except OSError as e:
            if e.errno not in _NO_DIRECTORY_SYNC:
                raise
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def open_read(self, name: str) -> Iterator[tuple[BinaryIO, int]]:
        with open(os.path.join(self.path, name), "rb") as f:
            yield f, os.fstat(f.fileno()).st_size

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(self.path, name))


class ArrowDirectory:
    """A directory on a pyarrow filesystem (HDFS, S3, GCS, ...): for stores not mounted locally.

    The same temp-then-move protocol; pyarrow has no fsync, so durability is what closing the
    stream gives on that filesystem. Where a move is not atomic (object stores copy), the footer
    still keeps a half-copied file from being read.
    """

    def __init__(
        self, filesystem: Any, path: str, uri: str | None = None, what: str = "directory"
    ) -> None:
        self.fs = filesystem
        self.path = path.rstrip("/") or "/"
        self._uri = uri or path
        self.what = what

    def _join(self, name: str) -> str:
        return f"{self.path.rstrip('/')}/{name}"

    def describe(self, name: str | None = None) -> str:
        return self._uri if name is None else f"{self._uri.rstrip('/')}/{name}"

    def prepare(self) -> None:
        from pyarrow import fs

        info = self.fs.get_file_info(self.path)
        if info.type == fs.FileType.File:
            raise _is_a_file(self.what, self._uri)
        try:
            if info.type == fs.FileType.NotFound:
                self.fs.create_dir(self.path, recursive=True)
            probe = self._join(temp_name("probe"))
            with self.fs.open_output_stream(probe):
                pass
            self.fs.delete_file(probe)
        except OSError as e:
            raise _unwritable(self.what, self._uri, e) from e

    def names(self) -> list[str]:
        from pyarrow import fs

        selector = fs.FileSelector(self.path, allow_not_found=True)
        return [info.base_name for info in self.fs.get_file_info(selector)]

    def write_atomically(self, name: str, write: Callable[[BinaryIO], Any]) -> None:
        move_into_place(self.fs, self.path, name, write)

    @contextlib.contextmanager
    def open_read(self, name: str) -> Iterator[tuple[BinaryIO, int]]:
        with self.fs.open_input_file(self._join(name)) as f:
            yield f, f.size()

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self._join(name))
