"""`from_delta`: a Delta table's live rows at one version as a Dataset, without Spark.

The `deltalake` package (delta-rs) replays the log: which Parquet files are live at the version
and, for files with a deletion vector, which of their rows are deleted. Those rows are stored in
each row group's piece (`Piece.deleted`, packed) and its `rows` count only the live ones: the
epoch's order is arithmetic on `rows`, and the reader drops the deleted rows as it reads the
group, so a deleted row never reaches a rank and every live row reaches one rank once per epoch.

What hora cannot honour is refused by name: a reader version above 3, a reader feature it does
not know, column mapping by id, and partition columns among the columns asked for (their values
live in the log, not in the files). Column mapping by name is honoured: columns are read by their
physical names and handed over by their logical ones.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hora.data._columns import SCALAR, Column
from hora.data._dataset import Dataset, EmptyDataError
from hora.data._files import DELTA, Piece, pack_deleted
from hora.data._footers import Footer, columns_of, nulls_message, read_footers
from hora.storage import Location

log = logging.getLogger("hora.data")

_FORMAT = 1  # bump when what the fingerprint covers changes
#: reader features whose tables hora reads correctly: deletion vectors (dropped as read),
#: column mapping (by name), types it refuses per column anyway (timestampNtz), and features of
#: the log that deltalake replays (v2Checkpoint) or that only guard writers (vacuumProtocolCheck)
READER_FEATURES = frozenset(
    {"deletionVectors", "columnMapping", "timestampNtz", "v2Checkpoint", "vacuumProtocolCheck"}
)
_PHYSICAL = "delta.columnMapping.physicalName"


def from_delta(
    path_or_uri: str | os.PathLike[str],
    version: int | None = None,
    *,
    columns: Sequence[str] | None = None,
    pad: Mapping[str, int] | None = None,
) -> Dataset:
    """The live rows of the Delta table at `path_or_uri` (a local or mounted path, a `file:`
    URI, or a URI that deltalake and pyarrow open) at `version` (the latest when None), as a
    small picklable `hora.data.Dataset` to capture in the training function.

    `columns`: the table's columns to keep (all when None; leave out the ones no tensor can
    hold). Rows removed by deletion vectors never reach a rank; the table's files are read in
    place and never deleted by hora (`delete()` leaves them). `pad` as for `from_spark`.
    """
    table, location = _open(path_or_uri, version)
    at = table.version()
    where = f"Delta table {location.uri!r} version {at}"
    _check_protocol(table, where)
    wanted = _columns(table, columns, where)
    uris = sorted(table.file_uris())
    names = [_relative(location, uri) for uri in uris]
    deleted = _deleted(table, uris, where)
    footers, described = _read_footers(location, names, wanted, where)
    pieces = _pieces(names, footers, deleted, where)
    _check_nulls(wanted, described, footers, pieces)
    if not pieces:
        raise EmptyDataError(f"{where} has no live rows: there is nothing to train on")
    dropped = sum(int(mask.sum()) for mask in deleted.values())
    key = _fingerprint(location, table, at, wanted, described, dict(pad or {}))
    renamed = {name: file for name, file in wanted if name != file}
    dataset = Dataset(
        location.location(),
        tuple(names),
        pieces,
        tuple(described),
        key,
        dict(pad or {}),
        renamed,
        DELTA,
    )
    log.info(
        "from_delta: %s version %d: %d files, %d live rows (%d deleted by deletion vectors)",
        location.uri,
        at,
        len(names),
        dataset.rows,
        dropped,
    )
    return dataset


def _read_footers(
    location: Location, names: Sequence[str], wanted: Sequence[tuple[str, str]], where: str
) -> tuple[list[Footer], list[Column]]:
    """Every live file's footer, and the columns as the loader sees them (one in every file)."""
    filesystem, base = location.arrow()
    footers: list[Footer] = []
    described: list[Column] = []
    paths = [f"{base.rstrip('/')}/{name}" for name in names]
    read = read_footers(filesystem, paths, [file for _, file in wanted])
    for name, footer in zip(names, read, strict=True):
        if isinstance(footer, FileNotFoundError):
            raise ValueError(
                f"{where}: its file {name} is not there (vacuumed, or not reachable from here): "
                "read a version whose files are kept, from a path every rank reaches"
            )
        if not isinstance(footer, Footer):  # not readable, or not Parquet to pyarrow
            raise ValueError(f"{where}: its file {name} cannot be read ({footer})") from footer
        found = columns_of(footer, wanted)
        if isinstance(found, str):
            raise ValueError(
                f"{where}: {name}: {found} (written before the column was added?); leave it "
                "out with columns="
            )
        if footers and found != described:
            raise ValueError(
                f"{where}: {name} holds {found}, unlike {names[0]}'s {described}: every file "
                "needs the same types"
            )
        footers.append(footer)
        described = found
    if not footers:
        raise ValueError(f"{where} has no files")
    return footers, described


def _open(path_or_uri: str | os.PathLike[str], version: int | None) -> tuple[Any, Location]:
    try:
        from deltalake import DeltaTable
    except ImportError as e:
        raise ValueError(
            "from_delta needs the deltalake package: pip install 'hora[data]' (or deltalake)"
        ) from e
    location = Location.parse(path_or_uri, "Delta table")
    try:
        table = DeltaTable(location.local or location.uri, version=version)
    except Exception as e:  # deltalake's own errors: no table there, no such version
        first = (str(e).strip().splitlines() or [""])[0]
        at = "" if version is None else f" at version {version}"
        raise ValueError(
            f"Delta table {location.uri!r}{at} cannot be opened ({type(e).__name__}: {first})"
        ) from e
    return table, location


def _check_protocol(table: Any, where: str) -> None:
    """Refuse, by name, what hora cannot read correctly."""
    protocol = table.protocol()
    if protocol.min_reader_version > 3:
        raise ValueError(
            f"{where} needs a reader of protocol version {protocol.min_reader_version}; hora "
            "reads versions 1 to 3"
        )
    features = set(protocol.reader_features or ()) if protocol.min_reader_version == 3 else set()
    unknown = sorted(features - READER_FEATURES)
    if unknown:
        raise ValueError(
            f"{where} uses reader features {unknown}, which hora does not read; it reads "
            f"{sorted(READER_FEATURES)}"
        )
    if _column_mapping(table) == "id":
        raise ValueError(
            f"{where} uses column mapping mode 'id' (columns found by field id), which hora does "
            "not read; mode 'name' and none are read"
        )


def _column_mapping(table: Any) -> str:
    """The column mapping mode the protocol lets readers honour ("none" where it does not)."""
    protocol = table.protocol()
    supported = protocol.min_reader_version == 2 or "columnMapping" in (
        protocol.reader_features or ()
    )
    mode = table.metadata().configuration.get("delta.columnMapping.mode") or "none"
    return str(mode).lower() if supported else "none"


def _columns(table: Any, columns: Sequence[str] | None, where: str) -> list[tuple[str, str]]:
    """(logical name, name in the files) of the columns asked for, in the table's order when
    all are asked for."""
    fields = {f.name: f for f in table.schema().fields}
    chosen = list(fields) if columns is None else list(columns)
    missing = [c for c in chosen if c not in fields]
    if missing:
        raise ValueError(f"{where}: columns {missing} are not in it; it has {list(fields)}")
    partitions = [c for c in chosen if c in set(table.metadata().partition_columns)]
    if partitions:
        raise ValueError(
            f"{where}: {partitions} are partition columns, "
            "whose values are in the log, not in the files hora reads: leave them out with "
            f"columns= (e.g. columns={[c for c in chosen if c not in partitions]})"
        )
    by_name = _column_mapping(table) == "name"
    return [(c, str(fields[c].metadata.get(_PHYSICAL, c)) if by_name else c) for c in chosen]


def _relative(location: Location, uri: str) -> str:
    """A live file's path under the table's root (deltalake gives absolute paths or URIs)."""
    if location.is_local:
        path = Location.parse(uri, "Delta file").local
        name = os.path.relpath(path, location.local)
    else:
        name = uri[len(location.uri.rstrip("/")) + 1 :] if uri.startswith(location.uri) else ".."
    if name.startswith(".."):
        raise ValueError(
            f"Delta table {location.uri!r}: its file {uri} is not under the table's directory "
            "(a shallow clone?); hora reads only tables whose files are under their root"
        )
    return name.replace(os.sep, "/")


def _key(uri_or_path: str) -> tuple[str, str]:
    """One spelling of a file's place, to match deltalake's listings with one another."""
    if "://" not in uri_or_path and not uri_or_path.startswith("file:"):
        return "", os.path.abspath(uri_or_path)
    parts = urllib.parse.urlsplit(uri_or_path)
    netloc = "" if parts.scheme == "file" else f"{parts.scheme}://{parts.netloc}"
    return netloc, urllib.parse.unquote(parts.path)


def _deleted(table: Any, uris: Sequence[str], where: str) -> dict[int, np.ndarray]:
    """Per file index, the mask of its rows that deletion vectors remove (files without one are
    left out). deltalake materializes each vector as a mask of rows to keep."""
    import pyarrow as pa

    if "deletionVectors" not in set(table.protocol().reader_features or ()):
        return {}
    if not hasattr(table, "deletion_vectors"):
        raise ValueError(
            f"{where} has deletion vectors, which this deltalake does not read out: pip "
            "install -U deltalake (1.6 reads them)"
        )
    index = {_key(uri): i for i, uri in enumerate(uris)}
    found: dict[int, np.ndarray] = {}
    vectors = pa.table(table.deletion_vectors())
    paths = vectors.column("filepath").to_pylist()
    keeps = vectors.column("selection_vector").combine_chunks()
    for row, path in enumerate(paths):
        if _key(path) not in index:
            raise ValueError(
                f"{where}: a deletion vector names {path}, which is not one of its live files: "
                "the table's log and files disagree"
            )
        keep = keeps[row].values.to_numpy(zero_copy_only=False).astype(bool)
        found[index[_key(path)]] = ~keep
    return found


def _pieces(
    names: Sequence[str],
    footers: Sequence[Footer],
    deleted: Mapping[int, np.ndarray],
    where: str,
) -> tuple[Piece, ...]:
    """The row groups with live rows; a group's deleted rows packed into its piece. A vector
    shorter than its file leaves the rows past its end live; one that deletes rows past the
    end of the file is refused (it does not belong to this file)."""
    pieces = []
    for index, footer in enumerate(footers):
        total = sum(rows for rows, _ in footer.groups)
        mask = deleted.get(index, np.zeros(0, dtype=bool))
        if mask[total:].any():
            raise ValueError(
                f"{where}: the deletion vector of {names[index]} deletes rows past its {total} rows"
            )
        mask = np.concatenate([mask[:total], np.zeros(max(0, total - len(mask)), dtype=bool)])
        start = 0
        for group, (rows, size) in enumerate(footer.groups):
            gone = mask[start : start + rows]
            start += rows
            live = rows - int(gone.sum())
            if live:
                pieces.append(Piece(index, group, live, size, pack_deleted(gone)))
    return tuple(pieces)


def _check_nulls(
    wanted: Sequence[tuple[str, str]],
    described: Sequence[Column],
    footers: Sequence[Footer],
    pieces: Sequence[Piece],
) -> None:
    """Nulls in a number column, counted off the footers of the row groups no deletion vector
    touches (in the others a null may be a deleted row's: the loader finds those as it reads)."""
    whole = {(p.file, p.group) for p in pieces if not p.deleted}
    for (name, file), column in zip(wanted, described, strict=True):
        if column.kind != SCALAR:
            continue
        total = sum(
            count or 0
            for index, footer in enumerate(footers)
            for group, count in enumerate(footer.nulls.get(file, ()))
            if (index, group) in whole
        )
        if total:
            raise ValueError(
                nulls_message(
                    name, total, "fill them in the table, or leave the column out with columns="
                )
            )


def _fingerprint(
    location: Location,
    table: Any,
    at: int,
    wanted: Sequence[tuple[str, str]],
    described: Sequence[Column],
    pad: Mapping[str, int],
) -> str:
    """A Delta version never changes: the table's place, its id (a table dropped and created
    again at the same place starts its versions again) and the version name the rows."""
    identity = {
        "format": _FORMAT,
        "table": location.location(),
        "id": table.metadata().id,
        "version": at,
        "columns": [
            [n, file, c.kind, c.dtype] for (n, file), c in zip(wanted, described, strict=True)
        ],
        "pad": dict(pad),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]
