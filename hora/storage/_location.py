"""One parser for every place hora keeps files: a local path, a `file:` URI, or a pyarrow URI.

Checkpoints, the estimator's store and the data door all name a place the same way and are
refused for the same reasons, with the same words; only the label in the message differs.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# pyarrow's filesystem and root path per URI, resolved once per process (a Location is pickled to
# executors and ranks; what pyarrow opened is not shipped with it).
_ARROW: dict[str, tuple[Any, str]] = {}


def temp_name(name: str) -> str:
    """A sibling name for a file being written: hidden (leading dot), `.tmp`, naming its pid."""
    return f".{name}.{os.getpid()}-{secrets.token_hex(4)}{TEMP_SUFFIX}"


def is_temp(name: str) -> bool:
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


# A file being written is named `.<final name>.<pid>-<random>.tmp`: the leading dot and the suffix
# keep it out of every listing of finished files, and the pid says who left it behind.
TEMP_SUFFIX = ".tmp"


@dataclass(frozen=True)
class Location:
    """A parsed place: `uri` as the user wrote it; `local` is its absolute path when it is on this
    machine's filesystem (a mounted share included), else "" and pyarrow opens `uri`."""

    uri: str
    local: str
    what: str = "store"  # how messages name it: "store", "Checkpoint directory", ...

    @classmethod
    def parse(cls, place: str | os.PathLike[str], what: str = "store") -> Location:
        text = os.fspath(place) if isinstance(place, str | os.PathLike) else place
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{what} must be a non-empty path or URI, got {place!r}")
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

    @property
    def is_local(self) -> bool:
        return bool(self.local)

    def arrow(self) -> tuple[Any, str]:
        """pyarrow's filesystem and the root's path on it; a clear error when it cannot open."""
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

    def child(self, *parts: str) -> Location:
        """The location of a directory under this one."""
        return Location.parse(self.location(*parts), self.what)

    def check_writable(self) -> None:
        """Create the root and prove a file can be written there, or say what to change."""
        filesystem = self.filesystem()
        probe = self.path(temp_name("probe"))
        try:
            filesystem.create_dir(self.root, recursive=True)
            with filesystem.open_output_stream(probe) as out:
                out.write(b"ok")
            filesystem.delete_file(probe)
        except (OSError, ValueError) as e:
            raise ValueError(
                f"{self.what} {self.uri!r} cannot be written ({e}); give a directory (or URI) "
                "that the driver and every executor can create files in"
            ) from e

    def exists(self, path: str) -> bool:
        from pyarrow import fs

        return self.filesystem().get_file_info(path).type != fs.FileType.NotFound

    def read_bytes(self, path: str) -> bytes:
        with self.filesystem().open_input_stream(path) as f:
            return bytes(f.read())

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a whole file: to a temp name first, then moved over `path`."""
        parent, name = path.rsplit("/", 1)
        move_into_place(self.filesystem(), parent, name, lambda out: out.write(data))

    def delete_dir(self, path: str) -> None:
        if self.exists(path):
            self.filesystem().delete_dir(path)


def move_into_place(filesystem: Any, parent: str, name: str, write: Callable[[Any], Any]) -> None:
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
