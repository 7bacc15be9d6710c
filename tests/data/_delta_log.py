"""Deletion vectors put into a Delta table's log by hand, as the Delta protocol writes them.

delta-rs writes none (its deletes rewrite files) and Spark's Delta jars are not at hand, so a
test commits them itself: a `remove` of the file and an `add` of the same file carrying a
`deletionVector` descriptor, inline (storageType "i": Z85 of the bitmap) or in a file of its own
("u": `deletion_vector_<uuid>.bin` under the table, Z85 of the uuid in the log). The bitmap is a
RoaringBitmapArray: the magic number 1681511377, then Roaring's portable 64-bit format (buckets
by the high 32 bits, each a standard 32-bit portable Roaring bitmap). A test then checks with
deltalake's own reader that the table reads without those rows.
"""

from __future__ import annotations

import json
import struct
import time
import uuid
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_MAGIC = 1681511377
_NO_RUNS = 12346  # Roaring's cookie of a bitmap without run containers


def z85(data: bytes) -> str:
    """ZeroMQ's Base85 (Delta pads the bytes to a multiple of 4; sizeInBytes says the length)."""
    data += b"\0" * (-len(data) % 4)
    out = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i : i + 4], "big")
        chunk = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            chunk.append(_Z85[digit])
        out += reversed(chunk)
    return "".join(out)


def roaring32(values: np.ndarray) -> bytes:
    """A standard portable 32-bit Roaring bitmap: array containers up to 4096 values, bitmaps
    above."""
    keys = np.unique(values >> 16)
    header = struct.pack("<II", _NO_RUNS, len(keys))
    described, bodies = b"", []
    for key in keys:
        low = (values[(values >> 16) == key] & 0xFFFF).astype("<u2")
        described += struct.pack("<HH", key, len(low) - 1)
        if len(low) <= 4096:
            bodies.append(low.tobytes())
        else:
            bits = np.zeros(1 << 16, dtype=bool)
            bits[low] = True
            bodies.append(np.packbits(bits, bitorder="little").tobytes())
    offset = len(header) + len(described) + 4 * len(keys)
    offsets = b""
    for body in bodies:
        offsets += struct.pack("<I", offset)
        offset += len(body)
    return header + described + offsets + b"".join(bodies)


def bitmap_array(rows: Iterable[int]) -> bytes:
    """Delta's serialized deletion vector of these row indexes."""
    values = np.unique(np.asarray(list(rows), dtype=np.uint64))
    highs = np.unique(values >> np.uint64(32))
    out = struct.pack("<iq", _MAGIC, len(highs))
    for high in highs:
        low = (values[(values >> np.uint64(32)) == high] & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        out += struct.pack("<I", int(high)) + roaring32(low)
    return out


def live_adds(table: Path) -> dict[str, dict[str, Any]]:
    """The table's live `add` actions by path, replayed from its JSON commits."""
    adds: dict[str, dict[str, Any]] = {}
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                adds[action["add"]["path"]] = action["add"]
            elif "remove" in action:
                adds.pop(action["remove"]["path"], None)
    return adds


def commit(table: Path, actions: list[dict[str, Any]]) -> int:
    """Write the next commit of the table; its version."""
    log = table / "_delta_log"
    version = max(int(p.stem) for p in log.glob("*.json")) + 1
    now = int(time.time() * 1000)
    lines = [{"commitInfo": {"timestamp": now, "operation": "DELETE"}}, *actions]
    (log / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in lines))
    return version


def delete_rows(
    table: Path, deleted: Mapping[str, Iterable[int]], inline: Mapping[str, bool]
) -> int:
    """Delete rows (by index in their file: all the file's deleted rows) with deletion vectors,
    each inline or in a file of its own; the protocol is raised to reader 3 / writer 7 with the
    deletionVectors feature. The new version."""
    adds = live_adds(table)
    now = int(time.time() * 1000)
    actions: list[dict[str, Any]] = [
        {
            "protocol": {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": ["deletionVectors"],
                "writerFeatures": ["deletionVectors"],
            }
        }
    ]
    for path, rows in deleted.items():
        rows = sorted(set(rows))
        data = bitmap_array(rows)
        old = adds[path]
        if inline[path]:
            vector = {"storageType": "i", "pathOrInlineDv": z85(data)}
        else:
            name = uuid.uuid4()
            body = struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
            (table / f"deletion_vector_{name}.bin").write_bytes(b"\x01" + body)
            vector = {"storageType": "u", "pathOrInlineDv": z85(name.bytes), "offset": 1}
        vector |= {"sizeInBytes": len(data), "cardinality": len(rows)}
        remove = {
            "path": path,
            "deletionTimestamp": now,
            "dataChange": True,
            "extendedFileMetadata": True,
            "partitionValues": old.get("partitionValues", {}),
            "size": old["size"],
        }
        if old.get("deletionVector"):
            remove["deletionVector"] = old["deletionVector"]
        actions += [{"remove": remove}, {"add": {**old, "deletionVector": vector}}]
    return commit(table, actions)
