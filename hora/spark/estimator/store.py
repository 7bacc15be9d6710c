"""Where an estimator keeps its files: one root, a fixed layout, any filesystem pyarrow opens.

    <store>/data/<fingerprint>/train, .../validation    the DataFrame as Parquet, written once
    <store>/runs/<run_id>/checkpoints/                    one hora.checkpoint file per epoch
    <store>/runs/<run_id>/logs/                           TensorBoard event files (rank 0)
    <store>/runs/<run_id>/model/                          the final model, for use outside Spark

The root is a local path (a mounted `/dbfs/...`-style share included), a `file:` URI, or any URI
pyarrow opens (`hdfs://`, `s3://`). Spark writes the Parquet through its own filesystems and the
ranks read it through pyarrow's, so both are given the same absolute location.
"""

from __future__ import annotations

import os
import secrets
import urllib.parse
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Store:
    """A store root, parsed once: a local directory or a pyarrow filesystem plus a path in it."""

    uri: str  # as the user gave it, for messages
    root: str  # the path on `filesystem` (absolute for a local directory)
    scheme: str  # "" for a local directory, else the URI's scheme
    netloc: str = ""

    @staticmethod
    def parse(location: str | os.PathLike[str]) -> Store:
        text = os.fspath(location)
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"store must be a non-empty path or URI, got {location!r}")
        parsed = urllib.parse.urlparse(text)
        if parsed.scheme == "file":
            if parsed.netloc not in ("", "localhost"):
                raise ValueError(
                    f"store {text!r}: a file: URI names a path on this machine, not on host "
                    f"{parsed.netloc!r}; write file:///path or mount the share"
                )
            return Store(text, os.path.abspath(urllib.parse.unquote(parsed.path)), "")
        if len(parsed.scheme) > 1 and "://" in text:
            return Store(text, parsed.path.rstrip("/") or "/", parsed.scheme, parsed.netloc)
        return Store(text, os.path.abspath(os.path.expanduser(text)), "")

    @property
    def is_local(self) -> bool:
        return self.scheme == ""

    def filesystem(self) -> Any:
        """The pyarrow filesystem the ranks and the driver read and write through."""
        from pyarrow import fs

        if self.is_local:
            return fs.LocalFileSystem()
        filesystem, _ = fs.FileSystem.from_uri(self.uri)
        return filesystem

    def path(self, *parts: str) -> str:
        """A path under the root on `filesystem()`."""
        return "/".join([self.root.rstrip("/"), *parts]) if parts else self.root

    def location(self, *parts: str) -> str:
        """The same place as a full location: a local path, or scheme://netloc/path."""
        if self.is_local:
            return os.path.join(self.root, *parts)
        return f"{self.scheme}://{self.netloc}{self.path(*parts)}"

    def spark_location(self, *parts: str) -> str:
        """The location as Spark's Hadoop filesystems want it (a local path gets `file://`)."""
        if self.is_local:
            return "file://" + os.path.join(self.root, *parts)
        return self.location(*parts)

    # the layout
    def data(self, key: str, split: str) -> str:
        return self.path("data", key, split)

    def run(self, run_id: str, *parts: str) -> str:
        return self.path("runs", run_id, *parts)

    def run_location(self, run_id: str, *parts: str) -> str:
        return self.location("runs", run_id, *parts)

    def check_writable(self) -> None:
        """Create the root and prove a file can be written there, or say what to change."""
        filesystem = self.filesystem()
        probe = self.path(f".hora-probe-{secrets.token_hex(4)}")
        try:
            filesystem.create_dir(self.root, recursive=True)
            with filesystem.open_output_stream(probe) as out:
                out.write(b"ok")
            filesystem.delete_file(probe)
        except (OSError, ValueError) as e:
            raise ValueError(
                f"store {self.uri!r} cannot be written ({e}); give a directory (or URI) that the "
                "driver and every executor can create files in"
            ) from e

    def exists(self, path: str) -> bool:
        from pyarrow import fs

        return self.filesystem().get_file_info(path).type != fs.FileType.NotFound

    def read_bytes(self, path: str) -> bytes:
        with self.filesystem().open_input_stream(path) as f:
            return f.read()

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a whole file: to a temp name first, then moved over `path`."""
        filesystem = self.filesystem()
        parent = path.rsplit("/", 1)[0]
        filesystem.create_dir(parent, recursive=True)
        temp = f"{parent}/.{path.rsplit('/', 1)[1]}.{secrets.token_hex(4)}.tmp"
        with filesystem.open_output_stream(temp) as out:
            out.write(data)
        try:
            filesystem.move(temp, path)
        except OSError:  # filesystems that refuse to move onto an existing file (HDFS)
            filesystem.delete_file(path)
            filesystem.move(temp, path)

    def delete_dir(self, path: str) -> None:
        if self.exists(path):
            self.filesystem().delete_dir(path)
