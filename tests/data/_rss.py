"""Run in a fresh process: one rank reads a whole dataset through a loader with a small prefetch
budget; prints the peak memory before and after, in bytes, as JSON. Without workers that is the
process's peak RSS; with workers, from their first batch on (a worker's own start is not the
stream's: docs/data.md states it), the peak of the proportional set size (PSS: shared pages
split between the processes that map them, so fork's copies and the shared-memory batches
count once) summed over the rank and its workers, sampled every 20 ms."""

from __future__ import annotations

import contextlib
import json
import resource
import sys
import threading

import psutil

import hora.data


def peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


class TreeMemory:
    """The largest PSS the rank and its child processes held together while it watched."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def now(self) -> int:
        me = psutil.Process()
        total = 0
        for process in [me, *me.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += process.memory_full_info().pss
        return total

    def _watch(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.now())

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def main(path: str, prefetch: int, workers: int = 0) -> None:
    dataset = hora.data.from_parquet(path)
    loader = dataset.loader(256, prefetch=prefetch, rank=0, size=1, num_workers=workers)
    next(iter(hora.data.from_parquet(path).loader(8, prefetch=1 << 16, rank=0, size=1)))
    rows = 0
    if not workers:
        before = peak()  # the interpreter, torch, pyarrow and one small read warmed up
        for batch in loader:
            rows += len(batch["x"])
        print(json.dumps({"before": before, "after": peak(), "rows": rows}))
        return
    batches = iter(loader)
    rows += len(next(batches)["x"])  # the workers started: their own memory is not the stream's
    with TreeMemory() as memory:
        before = memory.now()
        for batch in batches:
            rows += len(batch["x"])
    loader.close()
    print(json.dumps({"before": before, "after": memory.peak, "rows": rows}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:]))
