"""from_spark's path without a copy: a DataFrame that is a plain scan of Parquet files (see
`_scan`) becomes a Dataset over those very files, described by their footers on the driver.

No Spark job runs and nothing is written. What the written path counts while writing, this one
reads off the footers: rows per row group, nulls per number column (from the column chunks'
statistics, where the writer kept them; the loader refuses a null it meets anyway), and the
files' own types, which must be the DataFrame's. Arrays of several lengths are found by the
loader as it reads them, as for `from_parquet`.
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.parse
from collections.abc import Mapping, Sequence

from hora.data._columns import SCALAR, Column
from hora.data._dataset import Dataset, EmptyDataError
from hora.data._files import IN_PLACE, Piece
from hora.data._footers import Footer, columns_of, nulls_message, read_footers
from hora.data._scan import Scan
from hora.storage import Location

_FORMAT = 1  # bump when what the fingerprint covers changes


def read_in_place(scan: Scan, columns: Sequence[Column], pad: Mapping[str, int]) -> Dataset | str:
    """A Dataset over the scan's files; or, where they cannot stand for the DataFrame (a type
    that differs, a column a file lacks, a filesystem pyarrow cannot open), why not. Files the
    driver does not find, nulls in a number column and no rows at all are refused."""
    rooted = _rooted(scan.files)
    if isinstance(rooted, str):
        return rooted
    root, names = rooted
    try:
        filesystem, base = root.arrow()
    except ValueError as e:
        return str(e)
    wanted = list(scan.columns)
    scalars = [file for (name, file), c in zip(wanted, columns, strict=True) if c.kind == SCALAR]
    footers: list[Footer] = []
    paths = [f"{base.rstrip('/')}/{name}" for name in names]
    for name, footer in zip(names, read_footers(filesystem, paths, scalars), strict=True):
        if not isinstance(footer, Footer):
            where = f"{root.location(name)!r} (one of its {len(names)} input files)"
            if isinstance(footer, FileNotFoundError):
                why = f"does not find {where}: they are on disks the driver does not see"
            else:
                why = f"cannot read {where}: {footer}"
            raise ValueError(
                f"the DataFrame is a plain scan of Parquet files, read in place, but the driver "
                f"{why}. Read them from a path that the driver, every executor and every rank "
                "reach (a shared mount, or a URI such as hdfs:// or s3://), or pass copy=True "
                "to write the DataFrame to such a store"
            ) from None
        found = columns_of(footer, wanted)
        if isinstance(found, str):
            return f"{name}: {found}"
        for spark, here in zip(columns, found, strict=True):
            if (spark.kind, spark.dtype) != (here.kind, here.dtype):
                return (
                    f"column {spark.name!r} is {here.dtype} in {name} but {spark.dtype} in the "
                    "DataFrame"
                )
        footers.append(footer)
    _check_nulls(wanted, footers)
    pieces = tuple(
        Piece(index, group, rows, size)
        for index, footer in enumerate(footers)
        for group, (rows, size) in enumerate(footer.groups)
        if rows
    )
    if not pieces:
        raise EmptyDataError("the DataFrame is empty: there is nothing to train on")
    renamed = {name: file for name, file in wanted if name != file}
    key = _fingerprint(root, names, footers, wanted, columns, pad)
    return Dataset(
        root.location(), tuple(names), pieces, tuple(columns), key, dict(pad), renamed, IN_PLACE
    )


def _check_nulls(wanted: Sequence[tuple[str, str]], footers: Sequence[Footer]) -> None:
    for name, file in wanted:
        counts = [n for footer in footers for n in footer.nulls.get(file, ())]
        total = sum(n or 0 for n in counts)
        if total:
            fix = (
                f"fill them (df.fillna) or drop them (df.dropna(subset=[{name!r}])) before "
                "from_spark"
            )
            raise ValueError(nulls_message(name, total, fix))


def _rooted(files: Sequence[str]) -> tuple[Location, list[str]] | str:
    """The directory all the files are under, and each file's path relative to it."""
    locations = [Location.parse(f, "input file") for f in files]
    if all(location.is_local for location in locations):
        paths = [location.local for location in locations]
        top = os.path.commonpath([os.path.dirname(p) for p in paths])
        return Location.parse(top, "input files"), [os.path.relpath(p, top) for p in paths]
    parts = [urllib.parse.urlsplit(f) for f in files]
    places = {(p.scheme, p.netloc) for p in parts}
    if len(places) != 1 or any(location.is_local for location in locations):
        return f"its files are on {len(places)} filesystems"
    scheme, netloc = places.pop()
    folders = [p.path.split("/")[:-1] for p in parts]
    common = folders[0]
    for folder in folders[1:]:
        same = [a == b for a, b in zip(common, folder, strict=False)]
        common = common[: same.index(False) if False in same else len(same)]
    top = "/".join(common)
    names = [urllib.parse.unquote(p.path[len(top) + 1 :]) for p in parts]
    root = urllib.parse.urlunsplit((scheme, netloc, urllib.parse.unquote(top) or "/", "", ""))
    return Location.parse(root, "input files"), names


def _fingerprint(
    root: Location,
    names: Sequence[str],
    footers: Sequence[Footer],
    wanted: Sequence[tuple[str, str]],
    columns: Sequence[Column],
    pad: Mapping[str, int],
) -> str:
    """What identifies these files without reading their data: each file's path, size,
    modification time and rows per row group. Parquet files are written once and replaced, not
    edited: a rewrite changes the modification time (and mostly the size and the footer), so a
    loader state saved over other files is refused. Hashing the content would read all of it,
    which is what this path avoids."""
    described = {
        "format": _FORMAT,
        "root": root.location(),
        "files": [
            [name, f.size, f.mtime_ns, [rows for rows, _ in f.groups]]
            for name, f in zip(names, footers, strict=True)
        ],
        "columns": [
            [n, file, c.kind, c.dtype] for (n, file), c in zip(wanted, columns, strict=True)
        ],
        "pad": dict(pad),
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:20]
