"""Rows/s of one rank (or of each of R ranks on one host), each batch made by one function:
hora.data's loader with K workers against torch's DataLoader(num_workers=K) over the same row
groups and Mosaic Streaming's StreamingDataLoader(num_workers=K) over the same rows in MDS.

Two workloads (`--workload`), each written once to Parquet (row groups of `--group` rows) and,
for Mosaic, to MDS:

- images: `--rows` JPEGs (`--side` x `--side` RGB, made here with Pillow), decoded by
  `decode_one` (PIL to a uint8 array): batches of uint8 tensors [B, side, side, 3];
- text: `--rows` lines of random words, tokenized by a `tokenizers` WordLevel model trained
  here on them, padded and cut to `--length` ids: batches of int64 tensors [B, length].

The contenders (each yields batches of `--batch` rows, made by the same function):

- hora: `from_parquet(path).loader(batch, transform=..., num_workers=K)`, shuffled (and, for
  the shuffle's cost, in file order);
- DataLoader: a map-style dataset whose item i is row group i, made whole (batch_size=None,
  shuffled row groups), `num_workers=K`;
- Mosaic (images, one rank): a `StreamingDataset` whose `__getitem__` decodes one image,
  `StreamingDataLoader(batch_size, num_workers=K)`, shuffled.

Rounds alternate the contenders; each round times one epoch of each, worker start included.
With `--ranks R`, each contender runs as R processes started together (each with K workers:
hora's ranks split the rows, DataLoader's take every R-th row group), and a rank's rate is its
rows over its own epoch. Printed: the best and the median of the rounds in rows/s per rank, the
ratios (of the best, and of the medians), and K x one core's rate (the same function on up to
500 of the rows, in batches, in this process) as the ceiling.

    .venv/bin/python bench/data_images.py                            # K = 1 and 2, 2,000 images
    .venv/bin/python bench/data_images.py --rows 4000 --side 192 --group 250 --batch 250
    .venv/bin/python bench/data_images.py --workload text --contenders hora,torch
    .venv/bin/python bench/data_images.py --ranks 2 --workers 1 --contenders hora,torch
    .venv/bin/python bench/data_images.py --workers 1,2,4,8,14 --rows 20000     # a big host
    python3 bench/data_images.py --contenders hora,torch --device cuda       # onto a GPU
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one core per worker, as decoding
REPO = Path(__file__).resolve().parents[1]
STUBS = REPO / "tests" / "data" / "_stubs"
sys.path[:0] = [str(STUBS), str(REPO)]  # Mosaic imports torchvision: the stand-in first

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402

#: the workload's setting, read by the functions every process runs (set by `configure`)
SETTINGS: dict[str, Any] = {"workload": "images", "side": 224, "length": 128, "vocab": ""}
_TOKENIZER: list[Any] = []


def decode_one(data: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def decode(batch: dict[str, Any]) -> dict[str, Any]:
    """hora's transform for images: the batch's JPEGs decoded, stacked."""
    return {"image": np.stack([decode_one(b) for b in batch["image"]]), "label": batch["label"]}


def tokenizer() -> Any:
    if not _TOKENIZER:
        from tokenizers import Tokenizer

        made = Tokenizer.from_file(SETTINGS["vocab"])
        made.enable_padding(length=SETTINGS["length"])
        made.enable_truncation(SETTINGS["length"])
        _TOKENIZER.append(made)
    return _TOKENIZER[0]


def tokenize(batch: dict[str, Any]) -> dict[str, Any]:
    """hora's transform for text: each line to `length` token ids."""
    ids = [e.ids for e in tokenizer().encode_batch(list(batch["text"]))]
    return {"ids": np.array(ids, dtype=np.int64), "label": batch["label"]}


def transform() -> Any:
    return decode if SETTINGS["workload"] == "images" else tokenize


def one_core(rows: list[Any], batch: int) -> float:
    """Rows/s of the workload's function on up to 500 of the rows, in batches, in this process
    (the ceiling's unit: K workers make at most K times this)."""
    sample = rows[: min(500, len(rows))]
    name = "image" if SETTINGS["workload"] == "images" else "text"
    transform()({name: sample[:2], "label": np.arange(2)})  # loads the tokenizer, PIL's decoder
    start = time.perf_counter()
    for first in range(0, len(sample), batch):
        part = sample[first : first + batch]
        transform()({name: part, "label": np.arange(len(part))})
    return len(sample) / (time.perf_counter() - start)


def write_rows(folder: Path, count: int, group: int, mds: bool) -> tuple[Path, Path, list[Any]]:
    """The workload's rows as Parquet, and as MDS where Mosaic runs (images only)."""
    if SETTINGS["workload"] == "images":
        from tests.data._images import jpeg

        rows: list[Any] = [jpeg(i, SETTINGS["side"]) for i in range(count)]
        column = pa.array(rows, pa.binary())
        name = "image"
    else:
        rows = lines(count)
        column, name = pa.array(rows, pa.string()), "text"
        train_tokenizer(rows, folder / "vocab.json")
    table = pa.table({"label": np.arange(count) % 10, name: column})
    parquet = folder / "rows.parquet"
    pq.write_table(table, parquet, row_group_size=group)
    where = folder / "mds"
    if mds and SETTINGS["workload"] == "images":
        from streaming import MDSWriter

        with MDSWriter(out=str(where), columns={"label": "int64", "image": "bytes"}) as out:
            for i, data in enumerate(rows):
                out.write({"label": i % 10, "image": data})
    return parquet, where, rows


def lines(count: int) -> list[str]:
    """Lines of 20 to 200 words drawn from 20,000 made-up words (a Zipf-like draw)."""
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, rng.integers(2, 10))) for _ in range(20000)]
    weights = 1 / np.arange(1, len(words) + 1)
    weights /= weights.sum()
    found = []
    for _ in range(count):
        picked = rng.choice(len(words), rng.integers(20, 200), p=weights)
        found.append(" ".join(words[i] for i in picked))
    return found


def train_tokenizer(rows: list[str], path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    made = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    made.pre_tokenizer = pre_tokenizers.Whitespace()
    made.train_from_iterator(rows, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]"]))
    made.save(str(path))
    SETTINGS["vocab"] = str(path)


class RowGroups(torch.utils.data.Dataset):
    """torch's baseline: item i is row group `groups[i]` of the file, made whole."""

    def __init__(self, path: Path, rank: int = 0, ranks: int = 1) -> None:
        self.path = path
        self.groups = list(range(pq.ParquetFile(path).metadata.num_row_groups))[rank::ranks]
        self._file: Any = None

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self._file is None:  # opened in each worker
            self._file = pq.ParquetFile(self.path)
        table = self._file.read_row_group(self.groups[i])
        batch = {
            name: table.column(name).to_pylist() if name in ("image", "text") else
            table.column(name).to_numpy()
            for name in table.column_names
        }  # fmt: skip
        made = transform()(batch)
        return {k: torch.from_numpy(v if v.flags.writeable else v.copy()) for k, v in made.items()}


DEVICE: str | None = None  # --device: every contender's batches end on it (pinned copies)


def landed(batch: dict[str, Any]) -> int:
    """The batch's row count, once its tensors are on DEVICE when one is named."""
    if DEVICE is not None:
        if batch["label"].device.type == "cpu":
            batch = {k: v.to(DEVICE, non_blocking=True) for k, v in batch.items()}
        torch.cuda.current_stream().synchronize()
    return len(batch["label"])


def hora_epoch(path: Path, batch: int, workers: int, rank: int, ranks: int, shuffle: bool) -> int:
    import hora.data

    loader = hora.data.from_parquet(path).loader(
        batch, shuffle=shuffle, transform=transform(), num_workers=workers, rank=rank, size=ranks,
        pin_memory=DEVICE is not None, device=DEVICE,
    )  # fmt: skip
    try:
        return sum(landed(b) for b in loader)
    finally:
        loader.close()


def torch_epoch(path: Path, batch: int, workers: int, rank: int, ranks: int) -> int:
    loader = torch.utils.data.DataLoader(
        RowGroups(path, rank, ranks), batch_size=None, shuffle=True, num_workers=workers,
        pin_memory=DEVICE is not None,
    )  # fmt: skip
    return sum(landed(b) for b in loader)


def mosaic_epoch(mds: Path, batch: int, workers: int, rank: int, ranks: int) -> int:
    from streaming import StreamingDataLoader, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    class Decoded(StreamingDataset):
        def __getitem__(self, i: int) -> dict[str, Any]:  # type: ignore[override]
            sample = super().__getitem__(i)
            return {"image": torch.from_numpy(decode_one(sample["image"]).copy()),
                    "label": sample["label"]}  # fmt: skip

    clean_stale_shared_memory()
    dataset = Decoded(local=str(mds), shuffle=True, shuffle_seed=0, batch_size=batch)
    loader = StreamingDataLoader(dataset, batch_size=batch, num_workers=workers)
    return sum(len(b["label"]) for b in loader)


def timed(fn: Any, *args: Any) -> float:
    start = time.perf_counter()
    n = fn(*args)
    return n / (time.perf_counter() - start)


def _rank(settings: dict[str, Any], barrier: Any, results: Any, fn: Any, *args: Any) -> None:
    """One of R ranks started together: its own rate, after every rank has imported."""
    SETTINGS.update(settings)
    import hora.data  # noqa: F401

    barrier.wait()
    results.put(timed(fn, *args))


def per_rank(ranks: int, fn: Any, where: Path, batch: int, workers: int, *more: Any) -> float:
    """One epoch at `ranks` ranks on this host (each in a process of its own): the mean of
    the ranks' own rates."""
    if ranks == 1:
        return timed(fn, where, batch, workers, 0, 1, *more)
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(ranks), context.Queue()
    processes = [
        context.Process(
            target=_rank,
            args=(dict(SETTINGS), barrier, results, fn, where, batch, workers, r, ranks, *more),
        )
        for r in range(ranks)
    ]
    for process in processes:
        process.start()
    rates = [results.get(timeout=600) for _ in processes]
    for process in processes:
        process.join()
    return statistics.mean(rates)


def contenders(kinds: list[str], parquet: Path, mds: Path, ranks: int) -> list[tuple[Any, ...]]:
    """(name, epoch function, its data, its further arguments) for each contender asked for."""
    found: list[tuple[Any, ...]] = []
    if "hora" in kinds:
        found += [
            ("hora", hora_epoch, parquet, True),
            ("hora, file order", hora_epoch, parquet, False),
        ]
    if "torch" in kinds:
        found.append(("DataLoader", torch_epoch, parquet))
    if "mosaic" in kinds and ranks == 1 and SETTINGS["workload"] == "images":
        found.append(("Mosaic", mosaic_epoch, mds))
    return found


def report(k: int, ranks: int, rates: dict[str, list[float]], single: float) -> None:
    best = {name: max(r) for name, r in rates.items()}
    median = {name: statistics.median(r) for name, r in rates.items()}
    where = f"{ranks} ranks on this host, per rank" if ranks > 1 else "one rank"
    print(f"\nK={k} workers, {where} (rows/s: best and median of {len(rates['hora'])} epochs):")
    for name in rates:
        each = ", ".join(f"{r:,.0f}" for r in rates[name])
        print(f"  {name:18s} best {best[name]:9,.0f}  median {median[name]:9,.0f}   rounds: {each}")
    if "hora" not in best:
        return
    ceiling = k * single
    print(f"  hora / (K x one core's rate {ceiling:,.0f}): {best['hora'] / ceiling:.2f}")
    order = best["hora"] / best["hora, file order"]
    print(f"  hora shuffled / file order: {order:.2f}")
    for other in ("DataLoader", "Mosaic"):
        if other in best:
            print(
                f"  hora / {other}: {best['hora'] / best[other]:.2f}x best, "
                f"{median['hora'] / median[other]:.2f}x median"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=("images", "text"), default="images")
    parser.add_argument("--rows", "--images", type=int, default=2000)
    parser.add_argument("--side", type=int, default=224, help="images: pixels per side")
    parser.add_argument("--length", type=int, default=128, help="text: token ids per row")
    parser.add_argument("--group", type=int, default=64, help="rows per Parquet row group")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--ranks", type=int, default=1, help="ranks on this host, each K workers")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--contenders", default="hora,torch,mosaic")
    parser.add_argument("--device", help="e.g. cuda: batches copied there from pinned memory")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    SETTINGS.update(workload=args.workload, side=args.side, length=args.length)
    counts = [int(k) for k in args.workers.split(",")]
    kinds = args.contenders.split(",")
    root = Path(tempfile.mkdtemp(prefix="hora-bench-rows-"))
    try:
        parquet, mds, rows = write_rows(root, args.rows, args.group, "mosaic" in kinds)
        single = one_core(rows, args.batch)
        size = os.path.getsize(parquet) / len(rows) / 1e3
        what = (
            f"JPEGs of {args.side}x{args.side}"
            if args.workload == "images"
            else f"lines of text to {args.length} ids"
        )
        print(f"{args.rows} {what} ({size:.1f} KB each in Parquet), row groups of {args.group}, "
              f"batches of {args.batch}; {os.cpu_count()} cores, load "
              f"{os.getloadavg()[0]:.1f}; one core makes {single:,.0f} rows/s")  # fmt: skip
        for k in counts:
            rates: dict[str, list[float]] = {}
            for _ in range(args.rounds):
                for name, fn, where, *more in contenders(kinds, parquet, mds, args.ranks):
                    rate = per_rank(args.ranks, fn, where, args.batch, k, *more)
                    rates.setdefault(name, []).append(rate)
            report(k, args.ranks, rates, single)
        print(f"\nload {os.getloadavg()[0]:.1f} at the end")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
