"""Run in a fresh process: one rank reads a whole dataset through a loader with a small prefetch
budget; prints the peak RSS before and after, in bytes, as JSON."""

from __future__ import annotations

import json
import resource
import sys

import hora.data


def peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def main(path: str, prefetch: int) -> None:
    dataset = hora.data.from_parquet(path)
    loader = dataset.loader(256, shuffle=True, prefetch=prefetch, rank=0, size=1)
    next(iter(hora.data.from_parquet(path).loader(8, prefetch=1 << 16, rank=0, size=1)))
    before = peak()  # the interpreter, torch, pyarrow and one small read warmed up
    rows = 0
    for batch in loader:
        rows += len(batch["x"])
    print(json.dumps({"before": before, "after": peak(), "rows": rows}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
