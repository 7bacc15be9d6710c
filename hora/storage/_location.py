"""One face for every place hora keeps files: a local path, a `file:` URI, or a pyarrow URI.

Checkpoints, elastic commits, the estimator's store and the data door all name a place the same
way, are refused for the same reasons with the same words (only the label in the message
differs), and write through the same atomic writer (`_atomic`). Names of files under a place are
relative and `/`-separated ("runs/r1/model/model.pkl"), whatever the filesystem.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, BinaryIO

from hora.storage._atomic import temp_name, write_arrow, write_local

# pyarrow's filesystem and root path per URI, resolved once per process (a Location is pickled to
# executors and ranks; what pyarrow opened is not shipped with it).
_ARROW: dict[str, tuple[Any, str]] = {}


class NotWritableError(OSError, ValueError):
    """A place that cannot hold files; the message names it and says what to give instead.

    An OSError (the filesystem refused) and a ValueError (the setting is wrong) at once, so
    that either `except` catches it."""


def _parts(name: str) -> list[str]:
    return [part for part in name.split("/") if part]


@dataclass(frozen=True)
class Location:
    """A parsed place: `uri` as the user wrote it; `local` is its absolute path when it is on this
    machine's filesystem (a mounted share included), else "" and pyarrow opens `uri` (or `uri` is
    a path on `arrow_fs`, a pyarrow filesystem the user configured)."""

    uri: str
    local: str
    what: str = "store"  # how messages name it: "store", "Checkpoint directory", ...
    arrow_fs: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def parse(
        cls, place: str | os.PathLike[str], what: str = "store", *, filesystem: Any = None
    ) -> Location:
        """The place a path or URI names; with `filesystem` (a pyarrow FileSystem), `place` is a
        path on it. A ValueError says what to write instead."""
        text = os.fspath(place) if isinstance(place, str | os.PathLike) else place
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{what} must be a non-empty path or URI, got {place!r}")
        if filesystem is not None:
            return cls(text.rstrip("/") or "/", "", what, filesystem)
        parsed = urllib.parse.urlparse(text)
        if parsed.scheme == "file":
            if parsed.netloc not in ("", "localhost"):
                raise ValueError(
                    f"{what} {text!r}: a file: URI names a path on this machine, not on host "
                    f"{parsed.netloc!r}; write file:///path or mount the share"
                )
            return cls(text, os.path.abspath(urllib.parse.unquote(parsed.path)), what)
        if len(parsed.scheme) > 1 and "://" in text:  # "C:\\..." is a path, "hdfs://..." a URI
            return cls(text, "", what)
        return cls(text, os.path.abspath(os.path.expanduser(text)), what)

    # -- where: the place as each reader and writer names it --

    @property
    def is_local(self) -> bool:
        return bool(self.local)

    def arrow(self) -> tuple[Any, str]:
        """pyarrow's filesystem and the root's path on it; a clear error when it cannot open."""
        if self.arrow_fs is not None:
            return self.arrow_fs, self.uri
        try:
            from pyarrow import fs
        except ImportError as e:
            raise ValueError(
                f"{self.what} {self.uri!r} needs pyarrow (pip install pyarrow)"
                + ("" if self.is_local else ", or give a local or mounted path")
            ) from e
        if self.is_local:
            return fs.LocalFileSystem(), self.local
        if self.uri not in _ARROW:
            try:
                filesystem, path = fs.FileSystem.from_uri(self.uri)
            except (ValueError, OSError) as e:
                raise ValueError(f"{self.what} {self.uri!r}: pyarrow cannot open it ({e})") from e
            _ARROW[self.uri] = (filesystem, path.rstrip("/") or "/")
        return _ARROW[self.uri]

    def filesystem(self) -> Any:
        """The pyarrow filesystem the driver and the ranks read and write through."""
        return self.arrow()[0]

    @property
    def root(self) -> str:
        """The root's path on `filesystem()` (absolute for a local directory)."""
        return self.local or self.arrow()[1]

    def path(self, *parts: str) -> str:
        """A path under the root on `filesystem()`."""
        return "/".join([self.root.rstrip("/"), *parts]) if parts else self.root

    def location(self, *parts: str) -> str:
        """The same place as a full location: a local path, or the URI with `parts` appended."""
        if self.is_local:
            return os.path.join(self.local, *parts)
        return "/".join([self.uri.rstrip("/"), *parts]) if parts else self.uri

    def spark_location(self, *parts: str) -> str:
        """The location as Spark's Hadoop filesystems want it (a local path gets `file://`)."""
        if self.is_local:
            return "file://" + os.path.join(self.local, *parts)
        return self.location(*parts)

    def describe(self, name: str = "") -> str:
        """The place (or a file in it) as the user would write it, for messages."""
        return self.location(*_parts(name))

    def child(self, *parts: str) -> Location:
        """The location of a directory under this one."""
        if self.arrow_fs is not None:
            return replace(self, uri=self.path(*parts))
        return Location.parse(self.location(*parts), self.what)

    # -- files: every operation takes a name relative to the root --

    def _local(self, name: str) -> str:
        return os.path.join(self.local, *_parts(name))

    def check_writable(self) -> None:
        """Create the root and prove a file can be written there, or say what to change."""
        where = self.describe()
        if os.path.isfile(self.local) if self.is_local else self._is_file():
            raise NotWritableError(
                f"{self.what} {where!r} is a file, not a directory; give a directory path (it "
                "is created if missing)"
            )
        try:
            probe = temp_name("probe")
            if self.is_local:
                os.makedirs(self.local, exist_ok=True)
                with open(self._local(probe), "xb"):
                    pass
                os.remove(self._local(probe))
            else:
                filesystem = self.filesystem()
                filesystem.create_dir(self.root, recursive=True)
                with filesystem.open_output_stream(self.path(probe)):
                    pass
                filesystem.delete_file(self.path(probe))
        except OSError as e:
            raise NotWritableError(
                f"{self.what} {where!r} cannot be written ({e.strerror or e}); give a directory "
                "(or URI) that this process, and every process that shares it, can create "
                "files in"
            ) from e

    def _is_file(self) -> bool:
        from pyarrow import fs

        return bool(self.filesystem().get_file_info(self.root).type == fs.FileType.File)

    def names(self, folder: str = "") -> list[str]:
        """The names in a directory under the root; none when it does not exist yet."""
        if self.is_local:
            try:
                return os.listdir(self._local(folder))
            except FileNotFoundError:
                return []
        from pyarrow import fs

        selector = fs.FileSelector(self.path(*_parts(folder)), allow_not_found=True)
        return [info.base_name for info in self.filesystem().get_file_info(selector)]

    def exists(self, name: str = "") -> bool:
        if self.is_local:
            return os.path.exists(self._local(name))
        from pyarrow import fs

        info = self.filesystem().get_file_info(self.path(*_parts(name)))
        return bool(info.type != fs.FileType.NotFound)

    @contextlib.contextmanager
    def open_read(self, name: str) -> Iterator[tuple[BinaryIO, int]]:
        """A seekable binary file and its size."""
        if self.is_local:
            with open(self._local(name), "rb") as f:
                yield f, os.fstat(f.fileno()).st_size
        else:
            with self.filesystem().open_input_file(self.path(*_parts(name))) as f:
                yield f, f.size()

    def read_bytes(self, name: str) -> bytes:
        with self.open_read(name) as (f, _):
            return bytes(f.read())

    def write_atomically(self, name: str, write: Callable[[BinaryIO], Any]) -> None:
        """Have `write` fill a temp file beside `name`, then make it appear as `name` whole
        (fsynced, with its directory, on a local disk)."""
        *parent, base = _parts(name)
        if self.is_local:
            write_local(os.path.join(self.local, *parent), base, write)
        else:
            write_arrow(self.filesystem(), self.path(*parent), base, write)

    def write_bytes(self, name: str, data: bytes) -> None:
        self.write_atomically(name, lambda out: out.write(data))

    def remove(self, name: str) -> None:
        """Remove a file; one already gone is not an error."""
        with contextlib.suppress(FileNotFoundError):
            if self.is_local:
                os.remove(self._local(name))
            else:
                self.filesystem().delete_file(self.path(*_parts(name)))

    def remove_tree(self, name: str = "") -> None:
        """Remove a directory and everything under it (the root itself by default)."""
        if self.is_local:
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(self._local(name))
        elif self.exists(name):
            self.filesystem().delete_dir(self.path(*_parts(name)))
